"""The bad-input matrix: each mistake ends before training with a non-zero exit and one line
that names the value and the fix, and leaves no checkpoint or half-written file behind.

No wall-clock bounds: "ends early" is checked by what did not happen (no training iteration,
no checkpoint) and by the waits the messages report (the configured rendezvous timeout);
``HANG_GUARD`` only stops a test that would otherwise hang."""
import math
import time

import pytest

from mmddp_ext.entry.train import main
from mmddp_launch.rendezvous import find_free_port

from conftest import (DEMO_CONFIG, PYTHON, assert_no_debris, assert_not_trained, demo_options,
                      finish, popen)

pytestmark = pytest.mark.slow
TRAIN = [PYTHON, 'tools/dist_train.py']
HANG_GUARD = 600  # seconds; far beyond any of these runs (pytest-timeout: 900)
RENDEZVOUS_TIMEOUT = 5


def _error_lines(out: str, prefix: str = '[mmddp_ext] error:'):
    return [ln for ln in out.splitlines() if ln.startswith(prefix)]


# (case id, command after the config, env, words the single error line must contain)
CASES = [
    ('unknown scaling key', TRAIN, ['scaling.global_batch=64'], {},
     ["unknown key scaling.global_batch", "did you mean 'global_batch_size'"]),
    ('non-positive size', TRAIN, ['scaling.global_batch_size=0'], {},
     ['scaling.global_batch_size=0']),
    ('non-integer size', TRAIN, ['scaling.max_batch_per_device=2.5'], {},
     ['scaling.max_batch_per_device=2.5']),
    ('non-divisible global batch', ['bash', 'tools/dist_train.sh', '{config}', '2'],
     ['scaling.global_batch_size=33'], {}, [
         'scaling.global_batch_size=33 is not divisible by world_size 2', '32 or 34',
         '--cfg-options scaling.global_batch_size=32'
     ]),
    ('unknown runner_type', TRAIN, ['runner_type=DDPRuner'], {},
     ["runner_type='DDPRuner' is not a registered runner", "did you mean 'DDPRunner'?"]),
    ('our keys, stock runner', TRAIN, ['runner_type=Runner', 'scaling.global_batch_size=32'], {},
     ["sets `scaling` but runner_type is 'Runner'", "runner_type='DDPRunner'"]),
    ('RANK >= WORLD_SIZE', TRAIN, [],
     dict(RANK='2', WORLD_SIZE='2', MASTER_ADDR='127.0.0.1',
          MASTER_PORT='29999'), ['RANK=2 is out of range for WORLD_SIZE=2', '0..1']),
    ('MASTER_PORT not a port', TRAIN, [],
     dict(RANK='0', WORLD_SIZE='2', MASTER_ADDR='127.0.0.1',
          MASTER_PORT='http'), ["MASTER_PORT='http' is not a TCP port number"]),
]


@pytest.mark.parametrize('name, cmd, options, env, words', CASES, ids=[c[0] for c in CASES])
def test_one_line_error(name, cmd, options, env, words, demo_data, tmp_path, monkeypatch, capsys):
    """``tools/dist_train.py``'s refusals run in-process (``mmddp_ext.entry.train.main``, as the
    script calls it: nothing before them depends on the process); the ones of a shell script
    run it."""
    work = str(tmp_path / 'w')
    args = ['--work-dir', work, *demo_options(demo_data, 1), *options]
    if cmd == TRAIN:
        for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT'):
            monkeypatch.delenv(k, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        rc = main([DEMO_CONFIG, *args])
        captured = capsys.readouterr()
        out = captured.out + captured.err
    else:
        cmd = [c.replace('{config}', DEMO_CONFIG) for c in cmd]
        [(rc, out)] = finish([popen(cmd + args, env=env)], timeout=HANG_GUARD)
    assert rc != 0
    assert_not_trained(out)
    lines = _error_lines(out)
    assert lines and len(set(lines)) == 1, out[-3000:]  # one line (the same on every rank)
    for w in words:
        assert w in lines[0]
    assert_no_debris(work)


@pytest.mark.parametrize('cmd, line', [
    (TRAIN + ['no/such/config.py'], "[mmddp_ext] error: config file 'no/such/config.py' does "
     'not exist'),
    (['bash', 'tools/dist_train.sh', 'no/such/config.py', '2'
      ], "dist_train.sh: config file 'no/such/config.py' does not exist"),
    (['bash', 'tools/dist_train.sh', DEMO_CONFIG, 'two'
      ], "dist_train.sh: GPUS='two' must be a whole number"),
])
def test_missing_config_and_bad_script_arguments(cmd, line):
    [(rc, out)] = finish([popen(cmd)], timeout=HANG_GUARD)
    assert rc != 0 and line in out and 'Traceback' not in out


def _manual(rank, world, port, work, timeout=RENDEZVOUS_TIMEOUT):
    env = dict(
        RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port),
        MMDDP_RENDEZVOUS_TIMEOUT=str(timeout))
    return popen(TRAIN + [DEMO_CONFIG, '--work-dir', work], env=env)


# A port in use and an unreachable master under hand-set variables:
# tests/launcher/test_rendezvous.py (test_hand_set_rank_0_names_the_port_holder,
# test_hand_set_ranks_say_what_they_wait_for).


@pytest.fixture(scope='module')
def rendezvous_timeout_for_two(tmp_path_factory):
    """A rendezvous timeout that two processes started together meet within, on this machine
    under its load now: the wall time of one real cold start of the entry up to its rendezvous
    (rank 1 alone, against a port nobody listens on, giving up after 1 s), times 3; at least
    ``RENDEZVOUS_TIMEOUT``. Two processes started at once arrive at most one cold start apart."""
    work = str(tmp_path_factory.mktemp('cold_start'))
    start = time.monotonic()
    [(rc, out)] = finish([_manual(1, 2, find_free_port(), work, timeout=1)], timeout=HANG_GUARD)
    cold = time.monotonic() - start
    assert rc == 1 and 'rank 1 could not reach' in out, out[-3000:]  # it did reach the wait
    return max(RENDEZVOUS_TIMEOUT, math.ceil(3 * cold))


def test_world_size_larger_than_the_processes_started(rendezvous_timeout_for_two, tmp_path):
    timeout = rendezvous_timeout_for_two
    port = find_free_port()
    outs = finish(
        [_manual(0, 4, port, str(tmp_path), timeout),
         _manual(1, 4, port, str(tmp_path), timeout)], timeout=HANG_GUARD)
    assert all(rc == 1 for rc, _ in outs)
    [line] = _error_lines(outs[0][1])
    assert 'only 2 of WORLD_SIZE=4 processes joined' in line and 'start the missing ranks' in line
    assert f'within {timeout} s' in line  # the configured wait, then it gave up
    for _, out in outs:
        assert len(_error_lines(out)) == 1  # rank 1 says why as well
        assert_not_trained(out)
    assert_no_debris(str(tmp_path))


def test_missing_data_on_one_node_only(demo_data, tmp_path):
    """Node 1 (ranks 2, 3) has no data: the whole job stops, and the diagnosis names rank 2/3
    and the missing file rather than the collective errors of the ranks left waiting."""
    port = str(find_free_port())
    work = str(tmp_path / 'w')
    procs = []
    for node, root in ((0, demo_data), (1, str(tmp_path / 'no_data'))):
        procs.append(
            popen([
                PYTHON, '-m', 'torch.distributed.run', '--nnodes=2', f'--node_rank={node}',
                '--nproc_per_node=2', '--master_addr=127.0.0.1', f'--master_port={port}',
                'tools/dist_train.py', DEMO_CONFIG, '--work-dir', work, *demo_options(root, 1)
            ]))
    outs = finish(procs, timeout=HANG_GUARD)
    # both nodes stop (node 0's ranks are not left waiting for ranks that never come)
    assert all(rc != 0 for rc, _ in outs)
    for _, out in outs:
        assert_not_trained(out)
    [(_, diag)] = finish([popen([PYTHON, '-m', 'mmddp_ext.diagnose', work])], timeout=HANG_GUARD)
    assert 'first failing rank: 2' in diag or 'first failing rank: 3' in diag, diag
    assert 'Annotation file' in diag and 'no_data' in diag
    assert_no_debris(work)
