"""`kill -9` of a worker mid-epoch: torchrun restarts the workers, they resume from the
latest complete checkpoint and finish exactly the planned schedule."""
import os
import os.path as osp
import re
import signal
import subprocess
import time

import psutil
import pytest
import torch

from conftest import DEMO_CONFIG, ROOT, demo_options

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
    work = str(tmp_path / 'w')
    epochs = 4
    env = dict(os.environ, MAX_RESTARTS='1', OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1')
    proc = subprocess.Popen([
        'bash', 'tools/dist_train.sh', DEMO_CONFIG, '2', '--resume', '--work-dir', work,
        *demo_options(demo_data, epochs, **{'train_cfg.val_interval': '100'})
    ], cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not osp.exists(osp.join(work, 'last_checkpoint')):
            assert proc.poll() is None and time.monotonic() < deadline, 'no first checkpoint'
            time.sleep(0.2)
        done = int(re.search(r'epoch_(\d+)', open(osp.join(work, 'last_checkpoint')).read())[1])
        victim = _worker(proc.pid, '1')
        assert victim is not None
        os.kill(victim.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-4000:]
    resumed = [int(e) for e in re.findall(r'resumed epoch: (\d+)', out)]
    assert resumed and resumed[-1] >= done  # at most one checkpoint interval redone
    final = torch.load(
        osp.join(work, f'epoch_{epochs}.pth'), map_location='cpu', weights_only=False)
    plan = final['meta']['scaling_plan']
    iters_per_epoch = -(-64 // plan['samples_per_iter'])  # 64 training images
    assert final['meta']['epoch'] == epochs
    assert final['meta']['iter'] == epochs * iters_per_epoch  # exactly the planned schedule
    assert not osp.exists(osp.join(work, f'epoch_{epochs + 1}.pth'))
