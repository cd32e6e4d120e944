"""``python -m mmddp_ext.diagnose``: the summary of failure records written by the real
``record_failure`` (in-process), classified by the one out-of-memory classifier."""
import json
import os.path as osp

import pytest

import mmddp_ext.diagnose.records as record_module
from mmddp_ext.diagnose import summarize
from mmddp_ext.diagnose.records import read_failures, record_failure
from mmddp_ext.oom import classify as oom_module

PLAN = dict(per_device_batch_size=16, world_size=2, accumulative_counts=2, global_batch_size=64)


def _raise(exc):
    try:
        raise exc
    except Exception as e:  # noqa: B902 - the record takes whatever was raised
        return e


def test_onednn_failure_under_a_budget_is_diagnosed_as_out_of_memory(tmp_path, monkeypatch):
    """The failure of the finder's batch in the field: oneDNN cannot allocate under the
    address-space limit. The record says out of memory, and so does the diagnosis, with the
    advice for it."""
    monkeypatch.setattr(record_module, 'address_space_limit', lambda: 3 * 2**30)
    monkeypatch.setattr(oom_module, 'address_space_limit', lambda: 3 * 2**30)
    work = str(tmp_path)
    record_failure(work, 1, _raise(RuntimeError('could not create a primitive')),
                   dict(plan=PLAN, memory_budget_mib=1030))
    record = json.load(open(osp.join(work, 'failures', 'rank1.json')))
    assert record['oom'] is True and record['address_space_limit'] == 3 * 2**30
    text = summarize(work)
    assert 'first failing rank: 1' in text
    assert 'out of memory on rank 1' in text
    assert 'cause: out of memory at per-device batch 16' in text
    assert 'fix: --cfg-options scaling.max_batch_per_device=8' in text


def test_same_message_without_a_limit_is_not_called_out_of_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(record_module, 'address_space_limit', lambda: None)
    monkeypatch.setattr(oom_module, 'address_space_limit', lambda: None)
    record_failure(str(tmp_path), 0, _raise(RuntimeError('could not create a primitive')))
    text = summarize(str(tmp_path))
    assert 'RuntimeError: could not create a primitive' in text
    assert 'out of memory' not in text


def test_old_records_without_the_flag_are_classified_from_their_text(tmp_path):
    record = dict(
        rank=0, time=1.0, exc_type='RuntimeError', plan=PLAN,
        message="DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 "
        "bytes")
    text = summarize(str(tmp_path), [record])
    assert 'out of memory on rank 0' in text and 'fit: per-device batch' in text


def test_failure_records_are_written_atomically(tmp_path):
    path = record_failure(str(tmp_path), 3, _raise(ValueError('bad')))
    assert osp.basename(path) == 'rank3.json'
    assert sorted(p.name for p in (tmp_path / 'failures').iterdir()) == [
        'rank3.json', 'rank3.traceback.txt'
    ]  # no temporary file left behind


def test_the_rank_that_lost_its_peer_is_not_blamed(tmp_path):
    records = [
        dict(rank=0, time=1.0, exc_type='RuntimeError',
             message='[gloo/transport/tcp/pair.cc:534] Connection closed by peer'),
        dict(rank=1, time=2.0, exc_type='FileNotFoundError', message='no such file x')
    ]
    text = summarize(str(tmp_path), records, ranks={}, launch=[])
    assert 'first failing rank: 1' in text and 'then: rank 0 RuntimeError' in text


def test_a_signal_death_names_rank_pid_signal_iteration_and_memory(tmp_path):
    launch = [
        dict(rank=1, local_rank=1, pid=4242, exitcode=-9, signal='SIGKILL', host='node7', time=5.0)
    ]
    ranks = {
        1: dict(rank=1, run='t', time=4.0, completed_iter=7, rss=3 * 2**30, stacks=''),
        0: dict(rank=0, run='t', time=4.5, completed_iter=7, rss=2**30, stacks='')
    }
    records = [dict(rank=0, time=6.0, exc_type='RuntimeError', message='Connection closed by peer')]
    text = summarize(str(tmp_path), records, ranks, launch)
    assert ('rank 1 (host node7, pid 4242) was killed by SIGKILL after completing '
            'iteration 7') in text
    assert 'last memory sample: host RSS 3072 MiB' in text
    assert 'first failing rank' not in text  # rank 0 only lost its peer
    assert 'then: rank 0 RuntimeError (peer lost)' in text


def test_the_kernel_log_names_the_oom_killer():
    from mmddp_ext.diagnose.deaths import death_lines
    lines = death_lines(
        dict(rank=2, pid=77, exitcode=-9), dict(completed_iter=None),
        ['[ 12.3] Out of memory: Killed process 77 (python) total-vm:9kB'], None)
    assert lines[0].startswith('rank 2 (host None, pid 77) was killed by SIGKILL before '
                               'completing an iteration')
    assert "cause: the host's out-of-memory killer chose this rank" in '\n'.join(lines)


def test_progress_of_an_older_run_is_ignored(tmp_path):
    """A folder reused with fewer ranks: rank 3's file is from the previous run."""
    stuck = ('Timeout (0:00:09)!\nThread 0x1 (most recent call first):\n'
             '  File "/home/me/model.py", line 5 in forward\n')
    waits = ('Thread 0x2 (most recent call first):\n  File "/x/site-packages/torch/autograd/'
             'graph.py", line 8 in _engine_run_backward\n')
    ranks = {
        0: dict(rank=0, run='new', time=10, completed_iter=4, main_thread=2, stacks=waits),
        1: dict(rank=1, run='new', time=11, completed_iter=4, main_thread=1, stacks=stuck),
        3: dict(rank=3, run='old', time=1, completed_iter=9, main_thread=3, stacks='')
    }
    text = summarize(str(tmp_path), [], ranks, [])
    assert 'hang: no progress for 9 s' in text
    assert 'rank 1 did not arrive; it was in /home/me/model.py:5 in forward' in text
    assert "rank 0 waited in backward (DDP's gradient all-reduce)" in text
    assert 'rank 3' not in text


def test_the_waiting_rank_that_raised_when_its_peer_left_is_not_named():
    """Rank 1's watchdog ended it first; rank 0 then raised 'Connection closed by peer' and was
    stopped by torchrun while exiting (a dump without a Python frame)."""
    stuck = ('Timeout (0:00:08)!\nThread 0x1 (most recent call first):\n'
             '  File "/home/me/model.py", line 5 in forward\n')
    exiting = 'Current thread 0x2 (most recent call first):\n  Garbage-collecting\n'
    ranks = {
        0: dict(rank=0, run='r', time=10, completed_iter=2, main_thread=2, stacks=exiting),
        1: dict(rank=1, run='r', time=10, completed_iter=2, main_thread=1, stacks=stuck)
    }
    records = [
        dict(rank=0, time=12.0, exc_type='RuntimeError',
             message='[gloo/transport/tcp/pair.cc:561] Connection closed by peer')
    ]
    text = summarize('.', records, ranks, [])
    assert 'rank 1 did not arrive; it was in /home/me/model.py:5 in forward' in text
    assert 'rank 0 did not arrive' not in text
    assert 'rank 0 waited in a collective, until its peer went away' in text


def _agreed_errors():
    from mmddp_ext.errors import NothingFitsError
    from mmddp_ext.oom.ranks_out_of_memory import RanksOutOfMemoryError
    return [
        RanksOutOfMemoryError('out of memory on rank(s) [1] even with micro-batches', [1]),
        # the finder's warm-up ran out of memory on rank 1 only
        NothingFitsError(
            'not even a per-device batch of 1 fits on rank(s) [1] (the warm-up step ran out', [1])
    ]


@pytest.mark.parametrize('error', _agreed_errors(), ids=lambda e: type(e).__name__)
def test_agreed_out_of_memory_names_the_rank_that_ran_out_with_its_memory(tmp_path, error):
    """Every rank raises the same error when the ranks agree that rank 1 ran out (the guard's
    RanksOutOfMemoryError, the finder's NothingFitsError); rank 0 happens to write first. The
    diagnosis names rank 1, with rank 1's memory, and says rank 0 only agreed."""
    work = str(tmp_path)
    for rank, rss in ((0, 111 * 2**20), (1, 999 * 2**20)):
        record_failure(work, rank, _raise(error),
                       dict(plan=PLAN, memory=dict(now=dict(rss=rss, peak_rss=rss))))
    records = read_failures(work)
    assert [r['rank'] for r in records] == [0, 1]  # rank 0 wrote first
    assert all(r['oom'] and r['oom_ranks'] == [1] for r in records)
    text = summarize(work, ranks={}, launch=[])
    assert 'first failing rank: 1' in text
    assert 'out of memory on rank 1' in text and 'out of memory on rank 0' not in text
    assert 'host RSS 999 MiB' in text and '111 MiB' not in text
    assert (f'then: rank 0 {type(error).__name__} (agreed to stop: it did not run out itself)'
            in text)


def test_nothing_fits_error_survives_pickling():
    import pickle

    from mmddp_ext.errors import NothingFitsError
    message = 'not even a per-device batch of 1 fits on rank(s) [1] (the warm-up step ran out'
    back = pickle.loads(pickle.dumps(NothingFitsError(message, [1])))
    assert back.oom_ranks == [1] and str(back) == message


def test_ranks_out_of_memory_error_survives_pickling():
    import pickle

    from mmddp_ext.oom.classify import is_oom_error
    from mmddp_ext.oom.ranks_out_of_memory import RanksOutOfMemoryError
    back = pickle.loads(
        pickle.dumps(RanksOutOfMemoryError('out of memory on rank(s) [2, 0]', [2, 0])))
    assert back.oom_ranks == [0, 2] and str(back) == 'out of memory on rank(s) [2, 0]'
    assert is_oom_error(RanksOutOfMemoryError('no keyword in this text', [0]))


def test_a_rank_killed_without_a_launcher_report_is_named_with_its_node(tmp_path):
    """Under Slurm (srun --kill-on-bad-exit) no launcher reports who died: rank 1 left only its
    progress, rank 0 raised that its peer went away. The diagnosis names rank 1 and its node."""
    records = [
        dict(rank=0, time=2.0, exc_type='RuntimeError',
             message='[gloo/transport/tcp/pair.cc:534] Connection closed by peer')
    ]
    ranks = {
        r:
        dict(rank=r, run='20261201_1', time=1.0 + r, pid=100 + r, host='vm', slurm_node=f'n{r + 1}',
             completed_iter=6, stacks='')
        for r in (0, 1)
    }
    text = summarize(str(tmp_path), records, ranks=ranks, launch=[])
    assert 'rank 1 (node n2, pid 101) died without a Python exception after iteration 6' in text
    assert 'then: rank 0 lost its peer (RuntimeError)' in text
    assert 'first failing rank: 0' not in text
    # a real error on some rank stays the news
    records.append(dict(rank=1, time=3.0, exc_type='ValueError', message='bad'))
    assert 'first failing rank: 1' in summarize(str(tmp_path), records, ranks=ranks, launch=[])


WAITS = ('Thread 0x{t:x} (most recent call first):\n  File "/x/site-packages/torch/autograd/'
         'graph.py", line 8 in _engine_run_backward\n')
STUCK = ('Timeout (0:02:00)!\nThread 0x{t:x} (most recent call first):\n'
         '  File "/home/me/model.py", line 5 in forward\n')


def _progress(world, stuck=733):
    return {
        r:
        dict(rank=r, run='r', time=10, completed_iter=4 if r == stuck else 5, main_thread=r + 1,
             stacks=(STUCK if r == stuck else WAITS).format(t=r + 1))
        for r in range(world)
    }


def test_a_hang_of_1024_ranks_stays_one_screen_and_names_the_rank_that_did_not_arrive():
    text = summarize('.', [], _progress(1024), [])
    lines = text.splitlines()
    assert len(lines) < 40, text
    assert 'rank 733 did not arrive; it was in /home/me/model.py:5 in forward' in text
    assert "ranks 0-732, 734-1023 waited in backward (DDP's gradient all-reduce)" in text
    assert 'last completed iteration: ranks 0-732, 734-1023: 5; rank 733: 4' in text


def test_a_rank_stopped_in_its_metrics_gets_the_metric_bound_as_its_fix():
    ranks = _progress(4, stuck=0)
    ranks[0]['phase'] = 'val metrics'
    text = ' '.join(summarize('.', [], ranks, []).split())
    assert 'rank 0 did not arrive; it was in /home/me/model.py:5 in forward' in text
    assert ('fix: rank 0 was computing the val metrics when its bound ran out' in text
            and 'default_hooks.hang_watchdog=dict(metric_timeout=<seconds>)' in text)
    ranks[0]['phase'] = 'train'  # the same stack during training: the general fix
    assert 'dict(min_timeout=...)' in summarize('.', [], ranks, [])


def test_1024_ranks_that_lost_their_peer_are_one_line_and_the_raiser_is_named():
    lost = [
        dict(rank=r, time=2.0, exc_type='RuntimeError', message='[gloo] Connection closed '
             f'by peer [127.0.0.{r % 250}]:1234') for r in range(1024) if r != 733
    ]
    own = dict(rank=733, time=3.0, exc_type='ValueError', message='bad keypoint')
    text = summarize('.', lost + [own], ranks={}, launch=[])
    assert len(text.splitlines()) < 40, text
    assert 'first failing rank: 733' in text
    assert 'then: ranks 0-732, 734-1023 RuntimeError (peer lost)' in text


def test_1024_ranks_waiting_while_one_was_killed_stay_one_screen():
    lost = [
        dict(rank=r, time=2.0, exc_type='RuntimeError', message='Connection reset by peer')
        for r in range(1024) if r != 733
    ]
    launch = [dict(rank=733, pid=9, exitcode=-9, signal='SIGKILL', host='n92', time=1.0)]
    text = summarize('.', lost, _progress(1024), launch)
    assert len(text.splitlines()) < 40, text
    assert 'rank 733 (host n92, pid 9) was killed by SIGKILL' in text
    assert 'then: ranks 0-732, 734-1023 RuntimeError (peer lost)' in text


def test_every_rank_waiting_in_different_collectives_is_a_collective_mismatch():
    """The field's case on the demo: rank 1 read half of the data, finished its epoch and sat
    in SyncBuffersHook's all_reduce while rank 0 sat in DDP's forward of its next step."""
    in_hook = ('Timeout (0:02:00)!\nThread 0x2 (most recent call first):\n'
               '  File "/x/site-packages/torch/distributed/distributed_c10d.py", line 3913 in '
               'all_reduce\n  File "/x/site-packages/mmengine/hooks/sync_buffer_hook.py", line '
               '42 in after_train_epoch\n')
    in_step = ('Timeout (0:02:00)!\nThread 0x1 (most recent call first):\n'
               '  File "/x/site-packages/torch/nn/parallel/distributed.py", line 1776 in '
               '_pre_forward\n  File "/x/site-packages/mmengine/runner/loops.py", line 131 in '
               'run_iter\n')
    ranks = {
        0: dict(rank=0, run='r', time=1, completed_iter=2, main_thread=1, stacks=in_step),
        1: dict(rank=1, run='r', time=1, completed_iter=2, main_thread=2, stacks=in_hook)
    }
    text = summarize('.', [], ranks, [])
    assert 'every rank waited, in different collectives:' in text
    assert 'rank 1 waited in /x/site-packages/mmengine/hooks/sync_buffer_hook.py:42' in text
    assert 'rank 0 waited in /x/site-packages/mmengine/runner/loops.py:131' in text
    assert 'different data lengths' in text
    # positive control: the same place on every rank says nothing of a mismatch
    ranks[1]['stacks'] = in_step.replace('0x1', '0x2')
    assert 'different collectives' not in summarize('.', [], ranks, [])


def test_a_gloo_abort_in_the_kept_stderr_is_a_collective_mismatch_not_a_native_crash():
    launch = [dict(rank=1, pid=7, exitcode=-6, signal='SIGABRT', host='vm', time=1.0)]
    tail = ("terminate called after throwing an instance of 'gloo::EnforceNotMet'\n  what():  "
            '[enforce fail at pair.cc:464] op.preamble.length <= op.nbytes. 702308 vs 11144. '
            "Received data size doesn't match expected size. Is there a distributed collective "
            'mismatch in your code?\n')
    ranks = {
        r:
        dict(rank=r, run='r', time=1, completed_iter=4, stacks='',
             stderr_tail=tail if r == 1 else '')
        for r in (0, 1)
    }
    records = [dict(rank=0, time=2.0, exc_type='RuntimeError', message='Connection reset by peer')]
    text = summarize('.', records, ranks, launch)
    assert 'rank 1 (host vm, pid 7) was killed by SIGABRT' in text
    assert 'the ranks ran different collectives' in text and 'different data lengths' in text
    assert 'native code' not in text
    ranks[1]['stderr_tail'] = 'Segmentation fault in libfoo.so\n'  # positive control
    assert 'cause: a crash in native code' in summarize('.', records, ranks, launch)


def test_a_rank_that_raised_then_crashed_while_exiting_is_diagnosed_by_its_exception():
    """torchrun stops the other rank with SIGTERM; it had raised the same error and died of
    SIGSEGV while exiting (seen on the demo with an unused parameter)."""
    records = [
        dict(rank=r, time=1.0, exc_type='ValueError', message=f'bad value on rank {r}',
             world_size=2) for r in (0, 1)
    ]
    launch = [
        dict(rank=1, pid=5, exitcode=1, time=1.0),
        dict(rank=0, pid=4, exitcode=-11, signal='SIGSEGV', time=1.0)
    ]
    text = summarize('.', records, {}, launch)
    assert 'SIGSEGV' not in text
    assert 'ranks 0, 1 raised the same error' in text and 'no rank is the culprit' in text
    assert 'first failing rank' not in text


PEER_LOST_0 = dict(rank=0, time=1.0, exc_type='RuntimeError',
                   message='[gloo/transport/tcp/pair.cc:561] Connection closed by peer')
OWN_1 = dict(rank=1, time=2.0, exc_type='RuntimeError', message='injected fault')
LAUNCH_0 = dict(rank=0, exitcode=1, signal=None, time=3.0)
KILLED_1 = dict(rank=1, exitcode=-9, signal='SIGKILL', time=3.0)
STOPPED_1 = dict(rank=1, exitcode=-15, signal='SIGTERM', time=4.0)


@pytest.mark.parametrize(
    'records, launch, expected',
    [
        # the launcher saw the rank that lost its peer end first: the rank that raised is blamed
        ([PEER_LOST_0, OWN_1], [LAUNCH_0], 1),
        ([OWN_1, PEER_LOST_0], [LAUNCH_0], 1),
        # killed by a signal, no exception of its own: the killed rank
        ([PEER_LOST_0], [LAUNCH_0, KILLED_1], 1),
        # the launcher's own stop (SIGTERM) is a consequence: the rank that raised
        ([PEER_LOST_0, OWN_1], [LAUNCH_0, STOPPED_1], 1),
        # every rank only lost its peer: the first record
        ([PEER_LOST_0], [LAUNCH_0], 0),
        # no records (nothing raised in Python): the launcher's first failure
        ([], [KILLED_1, LAUNCH_0], 1),
        ([], [], None),
    ])
def test_rank_at_fault(records, launch, expected):
    from mmddp_ext.diagnose.summary import rank_at_fault
    assert rank_at_fault(records, launch) == expected
