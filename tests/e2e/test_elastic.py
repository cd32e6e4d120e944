"""`kill -9` of a worker mid-epoch: torchrun restarts the workers, they resume from the
latest complete checkpoint and finish exactly the planned schedule. The kill waits on an event
(the worker holds at a known iteration), not on a guessed time."""
import json
import os
import os.path as osp
import re
import signal
import subprocess

import psutil
import pytest
import torch

from conftest import ROOT, demo_options, demo_with_hooks
from tests.helpers.hold_rank_hook import read_iters
from tests.helpers.stop_point_hook import wait_for

pytestmark = pytest.mark.slow


def _worker(agent_pid: int, rank: str):
    for child in psutil.Process(agent_pid).children(recursive=True):
        try:
            if 'dist_train.py' in ' '.join(child.cmdline()) and \
                    child.environ().get('RANK') == rank:
                return child
        except psutil.Error:
            continue
    return None


def test_kill_a_worker_and_the_job_resumes_and_finishes(demo_data, tmp_path):
    """Rank 1 holds after iteration 3 (epoch 2 of 3, one checkpoint written, three iterations
    left): the test kills it there, at that event. The restarted workers redo at most what was
    trained since the last checkpoint, one checkpoint interval, and finish the schedule."""
    work, flags = str(tmp_path / 'w'), str(tmp_path / 'flags')
    epochs, held_after, interval = 3, 3, 1  # checkpoint every epoch (demo_options)
    config = demo_with_hooks(
        tmp_path, f'dict(type="HoldRankHook", rank=1, iteration={held_after}, '
        f'flag_dir={flags!r})', ['hold_rank_hook'])
    env = dict(os.environ, MAX_RESTARTS='1', OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1')
    proc = subprocess.Popen([
        'bash', 'tools/dist_train.sh', config, '2', '--resume', '--work-dir', work,
        *demo_options(demo_data, epochs)
    ], cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        wait_for([osp.join(flags, 'held')], bound=600, alive=lambda: proc.poll() is None)
        held = json.load(open(osp.join(flags, 'held')))
        done = int(re.search(r'epoch_(\d+)', open(osp.join(work, 'last_checkpoint')).read())[1])
        victim = _worker(proc.pid, '1')
        assert victim is not None and victim.pid == held['pid']  # rank 1, alive, holding
        os.kill(victim.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-4000:]
    final = torch.load(
        osp.join(work, f'epoch_{epochs}.pth'), map_location='cpu', weights_only=False)
    plan = final['meta']['scaling_plan']
    iters_per_epoch = -(-64 // plan['samples_per_iter'])  # 64 training images
    total = epochs * iters_per_epoch
    assert held['iter'] == held_after < total  # killed mid-schedule, iterations left
    assert done == (held_after - 1) // iters_per_epoch >= 1  # the checkpoints before the kill
    resumed = [(int(e), int(i)) for e, i in re.findall(r'resumed epoch: (\d+), iter: (\d+)', out)]
    assert resumed and set(resumed) == {(done, done * iters_per_epoch)}, resumed  # the latest
    redone = held_after - resumed[0][1]  # trained before the kill and again after it
    assert 0 <= redone <= interval * iters_per_epoch  # at most one checkpoint interval
    for rank in (0, 1):
        trained = [i for i, _ in read_iters(flags, rank)]
        assert trained == list(range(1, held_after + 1)) + list(
            range(resumed[0][1] + 1, total + 1)), (rank, trained)
    assert final['meta']['epoch'] == epochs
    assert final['meta']['iter'] == total  # exactly the planned schedule
    assert not osp.exists(osp.join(work, f'epoch_{epochs + 1}.pth'))
