"""A real single-process training of the demo config, and resuming from its checkpoint."""
import glob
import json
import math
import os.path as osp

import pytest
import torch

from conftest import DEMO_CONFIG, PYTHON, check_ok, demo_options, run

pytestmark = pytest.mark.slow


def _scalars(work_dir):
    [path] = glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json'))
    return [json.loads(line) for line in open(path)]


@pytest.fixture(scope='module')
def trained(demo_data, tmp_path_factory):
    work_dir = str(tmp_path_factory.mktemp('train'))
    out = check_ok(run([PYTHON, 'tools/dist_train.py', DEMO_CONFIG, '--work-dir', work_dir,
                        *demo_options(demo_data, max_epochs=2)]))
    return work_dir, out


def test_trains_with_finite_loss_and_writes_checkpoints(trained):
    work_dir, out = trained
    losses = [r['loss'] for r in _scalars(work_dir) if 'loss' in r]
    assert len(losses) >= 4 and all(math.isfinite(v) for v in losses)
    for epoch in (1, 2):
        assert osp.isfile(osp.join(work_dir, f'epoch_{epoch}.pth'))
    assert open(osp.join(work_dir, 'last_checkpoint')).read().strip().endswith('epoch_2.pth')
    assert 'coco/AP' in out


def test_resume_continues_from_the_checkpoint(trained, demo_data):
    work_dir, _ = trained
    out = check_ok(run([PYTHON, 'tools/dist_train.py', DEMO_CONFIG, '--work-dir', work_dir,
                        '--resume', *demo_options(demo_data, max_epochs=3)]))
    assert 'resumed epoch: 2' in out
    ckpt = torch.load(osp.join(work_dir, 'epoch_3.pth'), map_location='cpu', weights_only=False)
    assert ckpt['meta']['epoch'] == 3
    # the resumed run only did epoch 3: its log starts past the first run's iterations
    assert 'Epoch(train)   [1]' not in out and 'Epoch(train) [3]' in out


def test_resume_from_explicit_checkpoint(trained, demo_data, tmp_path):
    work_dir, _ = trained
    out = check_ok(run([PYTHON, 'tools/dist_train.py', DEMO_CONFIG, '--work-dir', str(tmp_path),
                        '--resume', osp.join(work_dir, 'epoch_1.pth'),
                        *demo_options(demo_data, max_epochs=2)]))
    assert 'resumed epoch: 1' in out
    assert osp.isfile(osp.join(tmp_path, 'epoch_2.pth'))
    assert not osp.exists(osp.join(tmp_path, 'epoch_1.pth'))
