"""A real single-process training of the demo config (``conftest.trained_demo``), and resuming
from its checkpoint, each a process forked from the preloaded stack (``tests/preloaded.py``)."""
import glob
import json
import math
import os.path as osp
import re

import pytest
import torch

from conftest import DEMO_CONFIG, check_ok, copy_of, demo_options
from preloaded import train

pytestmark = pytest.mark.slow

# MMEngine's LogProcessor: "Epoch(train)  [3][1/2]  lr: ...", the epoch right-aligned to
# the width of max_epochs and the iteration to the width of the epoch's length
TRAIN_LINE = re.compile(r'Epoch\(train\)\s*\[\s*(\d+)\]\[\s*(\d+)/(\d+)\]')


def _scalars(work_dir, run=0):
    """The logged scalars of the ``run``-th run (in time order) that logged into ``work_dir``."""
    paths = sorted(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')))
    return [json.loads(line) for line in open(paths[run])]


def _trained(out):
    """``{epoch: [iterations logged]}`` from a training log."""
    found = {}
    for epoch, i, _ in TRAIN_LINE.findall(out):
        found.setdefault(int(epoch), []).append(int(i))
    return found


def _iters_per_epoch(demo_data):
    """Training images / the global batch of the config name's NxbM (1xb32: 32)."""
    images = len(json.load(open(osp.join(demo_data, 'annotations', 'train.json')))['images'])
    n, m = re.search(r'_(\d+)xb(\d+)-', osp.basename(DEMO_CONFIG)).groups()
    return math.ceil(images / (int(n) * int(m)))


def test_trains_with_finite_loss_and_writes_checkpoints(trained_demo, demo_data):
    work_dir, out = trained_demo
    per_epoch = _iters_per_epoch(demo_data)
    losses = [r['loss'] for r in _scalars(work_dir) if 'loss' in r]
    assert len(losses) == 2 * per_epoch and all(math.isfinite(v) for v in losses)
    # every iteration of both epochs is in the log (logger interval 1)
    assert _trained(out) == {1: list(range(1, per_epoch + 1)), 2: list(range(1, per_epoch + 1))}
    for epoch in (1, 2):
        assert osp.isfile(osp.join(work_dir, f'epoch_{epoch}.pth'))
    assert open(osp.join(work_dir, 'last_checkpoint')).read().strip().endswith('epoch_2.pth')
    assert 'coco/AP' in out


def test_resume_continues_from_the_checkpoint(trained_demo, demo_data, tmp_path):
    first_dir, first = trained_demo
    work_dir = copy_of(first_dir, tmp_path)  # the run goes on in its own work dir
    per_epoch = _iters_per_epoch(demo_data)
    out = check_ok(
        train([
            DEMO_CONFIG, '--work-dir', work_dir, '--resume', *demo_options(demo_data, max_epochs=3)
        ], str(tmp_path / 'out')))
    assert 'resumed epoch: 2' in out
    ckpt = torch.load(osp.join(work_dir, 'epoch_3.pth'), map_location='cpu', weights_only=False)
    assert ckpt['meta']['epoch'] == 3 and ckpt['meta']['iter'] == 3 * per_epoch
    # the resumed run trained epoch 3, all of it, and neither epoch 1 nor 2 again (the same
    # pattern finds epochs 1 and 2 in the first run's log)
    assert sorted(_trained(first)) == [1, 2]
    assert _trained(out) == {3: list(range(1, per_epoch + 1))}
    # its iteration counter went on from the checkpoint's
    iters = [r['iter'] for r in _scalars(work_dir, run=-1) if 'loss' in r]
    assert iters == list(range(2 * per_epoch + 1, 3 * per_epoch + 1))


def test_resume_from_explicit_checkpoint(trained_demo, demo_data, tmp_path):
    work_dir, _ = trained_demo
    out = check_ok(
        train([
            DEMO_CONFIG, '--work-dir',
            str(tmp_path), '--resume',
            osp.join(work_dir, 'epoch_1.pth'), *demo_options(demo_data, max_epochs=2)
        ], str(tmp_path / 'out')))
    assert 'resumed epoch: 1' in out
    assert osp.isfile(osp.join(tmp_path, 'epoch_2.pth'))
    assert not osp.exists(osp.join(tmp_path, 'epoch_1.pth'))
