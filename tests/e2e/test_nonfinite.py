"""A NaN loss on one rank of a real 2-process run stops the run with a diagnosis naming it, and
no checkpoint is written after the last finite iteration.

The demo: 64 images, 2 ranks × 16 per device, so 2 iterations per epoch and a checkpoint (and
a validation, hence a "best" checkpoint) after every epoch. ``NanLossHook`` makes rank 1's loss
terms NaN at iteration 3, the first of epoch 2. Through DDP's gradient average that NaN reaches
rank 0's weights too; without ``FiniteLossHook`` the run used to go on logging ``loss: nan``,
exit 0 and save NaN checkpoints."""
import glob
import os
import os.path as osp

import pytest
import torch

from conftest import demo_options, demo_with_hooks
from preloaded import dist_train


@pytest.mark.slow
def test_nan_loss_on_rank1_stops_the_run_and_is_diagnosed(demo_data, tmp_path):
    cfg = demo_with_hooks(tmp_path, "dict(type='NanLossHook', rank=1, iteration=3)",
                          ['nan_loss_hook'], 'demo_nan.py')
    work = str(tmp_path / 'w')
    # by hand from the preloaded stack, the diagnosis after the ranks as dist_train.sh runs it
    proc = dist_train([
        cfg, '--work-dir', work,
        *demo_options(demo_data, 3, validate=True, **{'train_cfg.val_interval': '1'})
    ], 2, str(tmp_path / 'ranks'), diagnose=True)
    out = proc.stdout
    assert proc.returncode != 0, out[-4000:]
    assert 'loss: nan' not in out  # stopped at the first NaN, before it was logged
    tail = out[out.rindex('==== mmddp_ext diagnosis'):]
    assert 'first failing rank: 1' in tail, tail
    assert ('NonFiniteLossError: non-finite loss on rank 1 at iteration 3: loss_kpt=nan (lr '
            in tail), tail
    assert "stopping (FiniteLossHook action='stop'" in tail
    # nothing saved after iteration 2 (epoch 1): what is there is finite
    saved = sorted(osp.basename(p) for p in glob.glob(osp.join(work, '*.pth')))
    assert saved == ['best_coco_AP_epoch_1.pth', 'epoch_1.pth'], saved
    for name in saved:
        ckpt = torch.load(osp.join(work, name), weights_only=True)
        assert ckpt['meta']['iter'] <= 2, (name, ckpt['meta'])
        assert all(
            torch.isfinite(t).all() for t in ckpt['state_dict'].values() if t.is_floating_point())
    with open(osp.join(work, 'last_checkpoint')) as f:
        assert osp.basename(f.read().strip()) == 'epoch_1.pth'
    assert not [f for f in os.listdir(work) if f.endswith('.part')]


@pytest.mark.slow
def test_skip_and_warn_on_two_ranks(demo_data, tmp_path):
    """2 ranks started by hand from the preloaded stack (``tests/preloaded.py``):
    ``action='skip'`` with accumulation 2 (8 per device): the run trains to its end, the
    step of the cycle with rank 1's NaN (iteration 5, the first of epoch 2; its step is at 6)
    is skipped on every rank, and every
    checkpoint is finite. Then ``action='warn'`` from the same start: training goes on with the
    NaN that DDP spread to every rank's weights, and the runner refuses every save after it
    (the checkpoints of epoch 1 stay, finite, and ``last_checkpoint`` names them)."""
    outs = {}
    for action in ('skip', 'warn'):
        cfg = demo_with_hooks(
            tmp_path, f"dict(type='FiniteLossHook', action={action!r}), "
            "dict(type='NanLossHook', rank=1, iteration=5)", ['nan_loss_hook'], f'{action}.py')
        work = str(tmp_path / action)
        proc = dist_train([
            cfg, '--work-dir', work,
            *demo_options(demo_data, 2, validate=True, **{
                'train_cfg.val_interval': '1',
                'scaling.max_batch_per_device': '8'
            })
        ], 2, str(tmp_path / f'ranks_{action}'))
        outs[action] = out = proc.stdout
        assert proc.returncode == 0, out[-4000:]
        assert 'per-GPU batch 8 × 2 GPUs × accumulation 2 = global 32' in out
        assert 'Epoch(train) [2][4/4]' in out  # to the end
        assert 'non-finite loss on rank 1 at iteration 5: loss_kpt=nan' in out
        saved = {
            osp.basename(p): torch.load(p, weights_only=True)
            for p in glob.glob(osp.join(work, '*.pth'))
        }
        for name, ckpt in saved.items():
            assert all(
                torch.isfinite(t).all() for t in ckpt['state_dict'].values()
                if t.is_floating_point()), name
        with open(osp.join(work, 'last_checkpoint')) as f:
            outs[action + ' last'] = osp.basename(f.read().strip())
        outs[action + ' saved'] = sorted(saved)
    skip = outs['skip']
    assert ('optimizer step skipped at iteration 6 on every rank: 71 of 71 gradients are not '
            'finite after averaging over ranks') in skip
    assert skip.count('optimizer step skipped at iteration') == 1  # one cycle, one step
    assert 'refusing to save' not in skip
    assert outs['skip last'] == 'epoch_2.pth' and 'epoch_2.pth' in outs['skip saved']
    warn = outs['warn']
    assert "refusing to save epoch_2.pth: " in warn and 'earlier checkpoints are kept' in warn
    assert 'optimizer step skipped' not in warn
    assert outs['warn last'] == 'epoch_1.pth' and 'epoch_2.pth' not in outs['warn saved']
