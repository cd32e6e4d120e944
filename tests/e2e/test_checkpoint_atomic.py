"""A save that fails half-way never replaces the previous checkpoint, ``last_checkpoint`` names a
complete file afterwards, and the run resumes from it (one process each, forked from the preloaded
stack: ``tests/preloaded.py``)."""
import glob
import os.path as osp

import pytest
import torch

from conftest import DEMO_CONFIG, check_ok, copy_of, demo_options, demo_with_hooks
from preloaded import train

pytestmark = pytest.mark.slow


def _last(work):
    """The file ``last_checkpoint`` names."""
    return open(osp.join(work, 'last_checkpoint')).read().strip()


def _complete(path):
    """Load a checkpoint fully; its epoch (a partial file does not load)."""
    ckpt = torch.load(path, map_location='cpu', weights_only=False)
    assert {'meta', 'state_dict', 'optimizer'} <= set(ckpt) and 'zz_boom' not in ckpt
    return ckpt['meta']['epoch']


def test_failed_save_keeps_the_previous_checkpoint(trained_demo, demo_data, tmp_path):
    """A 2-epoch run (``conftest.trained_demo``, copied); resumed from epoch 1, its save of
    epoch 2 dies mid-write over the existing ``epoch_2.pth``."""
    work = copy_of(trained_demo[0], tmp_path)
    out_dir = str(tmp_path / 'out')
    before = open(osp.join(work, 'epoch_2.pth'), 'rb').read()
    # Redo epoch 2 from epoch 1 (as after an elastic restart); its save dies mid-write.
    failing = demo_with_hooks(tmp_path, "dict(type='FailSaveHook')", ['fail_save_hook'])
    proc = train([
        failing, '--work-dir', work, '--resume',
        osp.join(work, 'epoch_1.pth'), *demo_options(demo_data, 2)
    ], out_dir)
    assert proc.returncode != 0
    assert 'injected failure in the middle of a checkpoint save' in proc.stdout
    assert open(osp.join(work, 'epoch_2.pth'), 'rb').read() == before  # untouched
    assert not glob.glob(osp.join(work, '.*.part'))  # no debris
    assert _last(work) == osp.join(work, 'epoch_2.pth')
    assert _complete(_last(work)) == 2
    # ... so `--resume` finds a complete checkpoint and the run goes on
    out = check_ok(
        train([DEMO_CONFIG, '--work-dir', work, '--resume', *demo_options(demo_data, 3)], out_dir))
    assert 'resumed epoch: 2' in out
    ckpt = torch.load(osp.join(work, 'epoch_3.pth'), map_location='cpu', weights_only=False)
    assert ckpt['meta']['epoch'] == 3


def test_failed_save_after_a_successful_one_leaves_last_checkpoint_complete(
        trained_demo, demo_data, tmp_path):
    """In one run (resumed from epoch 1 of a copy of ``conftest.trained_demo``) a save
    succeeds (``last_checkpoint`` rewritten to it), then the next one dies mid-write:
    ``last_checkpoint`` still names the complete file of the successful save, the failed one
    leaves no file, and resuming goes on from there. (A failed save over an existing file:
    the test above.)"""
    work = copy_of(trained_demo[0], tmp_path)
    out_dir = str(tmp_path / 'out')
    assert _last(work) == osp.join(work, 'epoch_2.pth')  # the copy's own
    failing = demo_with_hooks(tmp_path, "dict(type='FailNthSaveHook', nth=2)",
                              ['fail_nth_save_hook'], 'demo_fail_2nd.py')
    proc = train([
        failing, '--work-dir', work, '--resume',
        osp.join(work, 'epoch_1.pth'), *demo_options(demo_data, 3)
    ], out_dir)
    assert proc.returncode != 0
    assert 'injected failure in the middle of a checkpoint save' in proc.stdout
    assert 'Saving checkpoint at 2 epochs' in proc.stdout  # the first save of the run
    assert 'Saving checkpoint at 3 epochs' in proc.stdout  # the second, which failed
    assert _last(work) == osp.join(work, 'epoch_2.pth')  # rewritten by it, not after
    assert _complete(_last(work)) == 2
    assert not osp.exists(osp.join(work, 'epoch_3.pth'))  # the failed save left no file
    assert not glob.glob(osp.join(work, '.*.part'))
    out = check_ok(
        train([DEMO_CONFIG, '--work-dir', work, '--resume', *demo_options(demo_data, 3)], out_dir))
    assert 'resumed epoch: 2' in out
    assert _complete(osp.join(work, 'epoch_3.pth')) == 3
    assert _last(work).endswith('epoch_3.pth')
