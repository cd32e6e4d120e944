"""DataLoader workers die with their rank and leave the stop signals to it: a rank killed by
SIGKILL (the host's OOM killer) leaves no orphaned worker behind, a SIGTERM or SIGUSR1 sent to
the whole job leaves the workers loading, and the loader's own worker_init_fn still runs."""
import os
import os.path as osp
import signal
import subprocess
import sys
import time

import psutil
import pytest

from mmddp_ext.dataloader.workers import WorkerInit, tie_workers

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _start(mode: str):
    proc = subprocess.Popen([sys.executable, '-m', 'tests.helpers.loader_child', mode], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith('workers'):
            break
    return proc, [int(p) for p in lines[-1].split()[1:]], lines


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='PR_SET_PDEATHSIG is Linux')
def test_workers_of_a_killed_rank_die_with_it():
    proc, workers, lines = _start('tie')
    try:
        assert len(workers) == 2 and all(_alive(p) for p in workers)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(60)
        deadline = time.monotonic() + 60  # a bound, not a measurement: death is immediate
        while any(_alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in workers if _alive(p)]
        rest = proc.stdout.read()  # the workers held the pipe: it closes when they are gone
        assert ''.join(lines + [rest]).count('initialised') == 2  # the loader's own init ran
    finally:
        for pid in [proc.pid] + workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _kill(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_tied_worker_leaves_a_stop_signal_to_its_rank():
    """SIGTERM and SIGUSR1 sent to every process of the job (Slurm, a process group) reach
    the workers: a tied worker ignores both and keeps loading, and neither the rank's handler
    nor its stack dump runs there. The rank itself still runs both (the control); an untied
    worker dies of the same SIGTERM (torch's own worker handler)."""
    proc, workers, _ = _start('term-tie')
    try:
        os.kill(proc.pid, signal.SIGTERM)  # the control: the rank's handler is live
        assert proc.stdout.readline() == f'SIGTERM in {proc.pid}, which goes on\n'
        for pid in workers:
            os.kill(pid, signal.SIGTERM)
            os.kill(pid, signal.SIGUSR1)
        proc.stdin.write('next\n')  # the rank loads 2 more batches: one from each worker
        proc.stdin.flush()
        assert proc.stdout.readline() == 'loaded 2 more batches\n'
        assert all(_alive(p) for p in workers)
    finally:
        _kill([proc.pid] + workers)
    err = proc.stderr.read()
    assert err.count('Current thread') + err.count('Thread 0x') >= 1  # the rank's dump
    assert 'SIGTERM in' not in proc.stdout.read()  # no worker ran the rank's handler
    plain, untied, _ = _start('term-plain')
    try:
        os.kill(untied[0], signal.SIGTERM)
        deadline = time.monotonic() + 60  # a bound, not a measurement: death is immediate
        while _alive(untied[0]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(untied[0])  # why the tie ignores it
    finally:
        _kill([plain.pid] + untied)


def test_a_rank_exiting_with_live_workers_is_not_held_by_them():
    """A rank that exits while its loader's iterator lives (a raised exception holds it): its
    workers, which ignore SIGTERM, are killed at its exit, so it exits with its own code at
    once; before, a tied worker ran the rank's stop handler and lived on for PreemptionHook's
    grace (25 s)."""
    proc, workers, _ = _start('exit-tie')
    try:
        assert proc.wait(120) == 3  # a bound, not a measurement
        out, err = proc.communicate()
        assert 'SIGTERM in' not in out and 'Exception ignored' not in err, (out, err)
        assert not [p for p in workers if _alive(p)]
    finally:
        _kill([proc.pid] + workers)


def test_tie_wraps_once_and_only_loaders_with_workers():
    from torch.utils.data import DataLoader
    loader = DataLoader([1, 2], num_workers=2)
    tie_workers(tie_workers(loader))
    assert isinstance(loader.worker_init_fn, WorkerInit)
    assert loader.worker_init_fn.func is not None  # a no-op: the worker only gets tied
    inline = DataLoader([1, 2], num_workers=0)
    assert tie_workers(inline).worker_init_fn is None


def test_tied_init_keeps_the_partial_mmengine_built():
    """MMEngine's build_dataloader makes ``worker_init_fn`` a ``functools.partial`` (its seeding,
    or the config's function); the tied one still exposes it (``.func``, ``.args``,
    ``.keywords``) and survives pickling (spawn). That it runs in each worker is
    ``test_workers_of_a_killed_rank_die_with_it``'s (calling it here would tie this process)."""
    import functools
    import pickle

    from torch.utils.data import DataLoader
    own = functools.partial(_record, 'a', seed=7)
    loader = tie_workers(DataLoader([1, 2], num_workers=2, worker_init_fn=own))
    tied = loader.worker_init_fn
    assert isinstance(tied, functools.partial) and tied is not own
    assert (tied.func, tied.args, tied.keywords) == (_record, ('a', ), dict(seed=7))
    copy = pickle.loads(pickle.dumps(tied))
    assert isinstance(copy, WorkerInit) and copy.parent_pid == tied.parent_pid == os.getpid()
    assert (copy.func, copy.args, copy.keywords) == (_record, ('a', ), dict(seed=7))


def _record(tag, worker_id, seed):
    return tag, worker_id, seed
