"""A save that fails half-way never replaces the previous checkpoint; the run resumes."""
import glob
import os.path as osp

import pytest
import torch

from conftest import DEMO_CONFIG, PYTHON, check_ok, demo_options, demo_with_hooks, run

pytestmark = pytest.mark.slow


def test_failed_save_keeps_the_previous_checkpoint(demo_data, tmp_path):
    work = str(tmp_path / 'w')
    train = [PYTHON, 'tools/dist_train.py']
    check_ok(run([*train, DEMO_CONFIG, '--work-dir', work, *demo_options(demo_data, 2)]))
    before = open(osp.join(work, 'epoch_2.pth'), 'rb').read()
    # Redo epoch 2 from epoch 1 (as after an elastic restart); its save dies mid-write.
    failing = demo_with_hooks(tmp_path, "dict(type='FailSaveHook')", ['fail_save_hook'])
    proc = run([*train, failing, '--work-dir', work, '--resume', osp.join(work, 'epoch_1.pth'),
                *demo_options(demo_data, 2)])
    assert proc.returncode != 0
    assert 'injected failure in the middle of a checkpoint save' in proc.stdout
    assert open(osp.join(work, 'epoch_2.pth'), 'rb').read() == before  # untouched
    assert not glob.glob(osp.join(work, '.*.part'))                   # no debris
    assert open(osp.join(work, 'last_checkpoint')).read().strip().endswith('epoch_2.pth')
    # ... so `--resume` finds a complete checkpoint and the run goes on
    out = check_ok(run([*train, DEMO_CONFIG, '--work-dir', work, '--resume',
                        *demo_options(demo_data, 3)]))
    assert 'resumed epoch: 2' in out
    ckpt = torch.load(osp.join(work, 'epoch_3.pth'), map_location='cpu', weights_only=False)
    assert ckpt['meta']['epoch'] == 3
