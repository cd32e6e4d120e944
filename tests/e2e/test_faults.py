"""Faults injected into the demo, 2 real processes, ``bash tools/dist_train.sh``, loading with the
demo's own DataLoader workers (2, persistent): the last screen names the right rank, the cause
and the fix (a stuck rank, the same with a short collective timeout, a rank killed by SIGKILL
whose workers must not outlive it, a worker killed by itself); a worker that the job's own stop
ended is never named."""
import json
import os.path as osp
import re
import subprocess
import time

import psutil
import pytest

from conftest import DEMO_WORKERS, demo_options, demo_with_hooks, run

SCREEN = 25  # lines a user sees without scrolling


def _train(tmp_path, demo_data, hooks: str, *extra_options: str, name: str,
           modules=('fault_hook', ), env=None):
    cfg = demo_with_hooks(tmp_path, hooks, list(modules), name)
    work = str(tmp_path / 'w')
    opts = demo_options(demo_data, 3, **{'train_dataloader.batch_size': '8', **DEMO_WORKERS})
    proc = run(['bash', 'tools/dist_train.sh', cfg, '2', '--work-dir', work, *opts, *extra_options],
               timeout=600, env=env)
    screen = '\n'.join(proc.stdout.rstrip().splitlines()[-SCREEN:])
    assert 'DataLoader worker (pid' not in screen or 'kill_worker' in name, screen
    assert 'failed (what this rank sees)' not in proc.stdout  # one screen: the front's
    return proc, screen, work


@pytest.mark.slow
@pytest.mark.waits
def test_a_stuck_rank_is_named_not_the_rank_that_waits(demo_data, tmp_path):
    proc, screen, _ = _train(
        tmp_path, demo_data, "dict(type='HangWatchdogHook', min_timeout=8, slow_timeout=120), "
        "dict(type='FaultHook', rank=1, at_iter=3, fault='stuck')", name='stuck.py')
    assert proc.returncode != 0
    assert 'hang: no progress for' in screen, proc.stdout[-5000:]
    assert 'rank 1 did not arrive; it was in' in screen and 'fault_hook.py' in screen
    assert 'rank 0 waited in' in screen
    assert 'last completed iteration: ranks 0, 1: 2' in screen
    # the fix for a hang, not another cause's: where to look, and the bound that fired
    flat = ' '.join(screen.split())
    assert 'fix: look at the line above of the rank that did not arrive' in flat
    assert "the bound is HangWatchdogHook's" in flat and 'out-of-memory' not in flat


@pytest.mark.slow
@pytest.mark.waits
def test_a_short_collective_timeout_still_names_the_stuck_rank(demo_data, tmp_path):
    """The field's case: rank 0's collective times out first and raises; rank 1, stopped by
    torchrun, is the one named, from the stack it dumped."""
    # grace=1: the stuck rank, told to stop by torchrun, would otherwise wait PreemptionHook's
    # 25 s for a save it can never reach before it dies of the SIGTERM (its stack is dumped at
    # the signal, first)
    proc, screen, _ = _train(
        tmp_path, demo_data, "dict(type='HangWatchdogHook', min_timeout=600), "
        "dict(type='PreemptionHook', grace=1), "
        "dict(type='FaultHook', rank=1, at_iter=3, fault='stuck')", 'env_cfg.dist_cfg.timeout=10',
        name='stuck_timeout.py')
    assert proc.returncode != 0
    assert 'hang: collective timeout on rank 0' in screen, proc.stdout[-5000:]
    assert 'rank 1 did not arrive; it was in' in screen and 'fault_hook.py' in screen
    assert 'rank 0 waited in a collective that timed out' in screen
    assert 'first failing rank: 0' not in proc.stdout


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
def test_a_rank_killed_by_sigkill_is_named_and_leaves_no_worker(demo_data, tmp_path):
    proc, screen, work = _train(tmp_path, demo_data,
                                "dict(type='FaultHook', rank=1, at_iter=3, fault='sigkill')",
                                name='sigkill.py')
    assert proc.returncode != 0
    fault = json.load(open(osp.join(work, 'fault_rank1.json')))
    assert 'rank 1 (host' in screen, proc.stdout[-5000:]
    assert f'pid {fault["pid"]}) was killed by SIGKILL after completing iteration 2' in screen
    assert 'last memory sample: host RSS' in screen
    # a SIGKILL's cause and fix: the host's out-of-memory killer (named from the kernel log
    # where it can be read, else as the likely cause), and host memory, not GPU memory
    flat = ' '.join(screen.split())
    assert "the host's out-of-memory killer" in flat
    assert 'fix: if memory: fewer DataLoader workers (train_dataloader.num_workers)' in flat
    assert 'did not arrive' not in flat
    assert len(fault['workers']) >= 2  # its DataLoader workers...
    deadline = time.monotonic() + 30  # ...die with it (a bound; they die at once)
    while any(_alive(p) for p in fault['workers']) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in fault['workers'] if _alive(p)]


@pytest.mark.slow
def test_a_worker_killed_by_itself_is_the_cause_on_its_rank(demo_data, tmp_path):
    """As the host's out-of-memory killer picks a DataLoader worker: its rank raises torch's
    error, and the screen names that rank, the worker and the fix."""
    proc, screen, work = _train(tmp_path, demo_data,
                                "dict(type='FaultHook', rank=1, at_iter=3, fault='kill_worker')",
                                name='kill_worker.py')
    assert proc.returncode != 0
    fault = json.load(open(osp.join(work, 'fault_rank1.json')))
    assert 'first failing rank: 1 (host' in screen, proc.stdout[-5000:]
    assert f'DataLoader worker (pid {fault["worker"]}) is killed by signal: Killed' in screen
    flat = ' '.join(screen.split())
    assert (f'cause: its DataLoader worker (pid {fault["worker"]}) died of SIGKILL, alone: most '
            "often the host's out-of-memory killer") in flat
    assert 'fix: fewer DataLoader workers (train_dataloader.num_workers)' in flat
    assert 'then: rank 0 RuntimeError (peer lost)' in flat
    assert 'raised at' not in flat  # the worker's death interrupts the rank anywhere


def _chattr_ok(tmp_path) -> bool:
    probe = tmp_path / 'probe'
    probe.mkdir()
    ok = subprocess.run(['chattr', '+i', str(probe)], capture_output=True).returncode == 0
    subprocess.run(['chattr', '-i', str(probe)], capture_output=True)
    return ok


@pytest.mark.slow
def test_a_work_dir_that_stops_taking_writes_is_named_with_the_cause(demo_data, tmp_path):
    """The work dir refuses every write from the second save on (RefuseWritesHook: immutable,
    as a read-only remount or an export's rules make it): rank 0's save fails with EPERM, and
    neither its failure record nor rank 1's, nor their progress, fit there. They are kept in
    the spare folder under $TMPDIR; the screen names rank 0, the refused checkpoint with the
    previous one intact and the fix, and the work dir that refused the records and where they
    went; it never says that no rank raised."""
    if not _chattr_ok(tmp_path):
        pytest.skip('chattr +i is not permitted here (needs root and ext4, xfs or btrfs)')
    tmp = tmp_path / 'tmp'
    tmp.mkdir()
    work = str(tmp_path / 'w')
    try:
        proc, screen, _ = _train(tmp_path, demo_data, "dict(type='RefuseWritesHook')",
                                 name='refuse.py', modules=('refuse_writes_hook', ),
                                 env={'TMPDIR': str(tmp)})
    finally:
        subprocess.run(['chattr', '-R', '-i', work], check=False)
    assert proc.returncode != 0
    flat = ' '.join(screen.split())
    assert 'first failing rank: 0' in flat, proc.stdout[-5000:]
    prev = osp.join(work, 'epoch_1.pth')
    assert (f"the work dir refused checkpoint {osp.join(work, 'epoch_2.pth')}: Operation not "
            f'permitted') in flat
    assert f'the previous checkpoint {prev} is intact, no partial file was left' in flat
    assert f'fix: let {work} take new files again' in flat and f'--resume {prev}' in flat
    spare = re.escape(str(tmp)) + r'/mmddp_ext-records-\d+/w-[0-9a-f]{10}'
    for rank in (0, 1):
        assert re.search(
            rf"rank {rank}'s records: the work dir {re.escape(work)} refused them "
            rf'\(PermissionError: \[Errno 1\] Operation not permitted[^)]*\); kept in {spare} on '
            'host', flat), flat
    assert 'no rank raised' not in proc.stdout
    assert not osp.exists(osp.join(work, 'failures'))  # nothing of them in the work dir
