"""The GPU check's steps on the user's own path (``bench/gpu_check.py`` runs them).

* ``bash tools/dist_train.sh DEMO 2``, the seed's command: with 2 or more GPUs the two ranks
  (local ranks 0 and 1) must agree and train; with one GPU, local rank 1 has no GPU of its own
  and every rank must stop with the one line that names both numbers (docs/launching.md,
  'The variables');
* the step time of ``MicrobatchDDP`` (the default guard with ``max_batch_per_device='auto'``:
  no reducer, no overlap of all-reduce and backward) against MMEngine's DDP at the same batch;
* the RetinaNet example for a few iterations: mmcv's compiled ops (``nms``, ``roi_align``) on
  CUDA tensors.
"""
import os.path as osp
import re
import statistics
from typing import Any, List

from common import DEMO, PYTHON, ROOT, data_options, iteration_times

DET = osp.join(ROOT, 'configs', 'examples', 'mmdet', 'retinanet_r18_fpn_1xb4-12e_demo-det-128.py')
ONE_GPU_LINE = '2 processes on this node (LOCAL_WORLD_SIZE=2) but 1 GPU(s) visible'


def _tail(text: str) -> str:
    lines = [ln for ln in text.splitlines() if 'rror' in ln] or text.strip().splitlines() or ['']
    return lines[-1][-200:]


def seed_command(c: Any) -> None:
    """``dist_train.sh DEMO 2`` as the seed typed it."""
    work = osp.join(c.tmp, 'seed')
    cmd = [
        'bash', 'tools/dist_train.sh', DEMO, '2', '--work-dir', work, '--cfg-options',
        *data_options(c.data, 1)
    ]
    [(rc, out)] = c.run([cmd], 150)
    name = 'dist_train.sh DEMO 2 (local ranks 0 and 1)'
    if c.gpus >= 2:
        agreed = '2 ranks agree' in out and 'ranks disagree' not in out
        c.row(name, f'exit {rc}', 'pass' if rc == 0 and agreed else 'fail',
              'the ranks agree and train' if rc == 0 and agreed else _tail(out))
        return
    stopped = rc not in (0, None) and ONE_GPU_LINE in out and 'Epoch(train)' not in out
    c.row(name, f'exit {rc}', 'pass' if stopped else 'fail',
          'one GPU: every rank stops with the one line' if stopped else _tail(out))


def _step_times(c: Any, name: str, nproc: int, options: List[str]) -> List[float]:
    work = osp.join(c.tmp, name)
    cmd = [
        'bash', 'tools/dist_train.sh', DEMO,
        str(nproc), '--work-dir', work, '--cfg-options', *data_options(c.data, 2), *options
    ]
    [(rc, out)] = c.run([cmd], 150)
    if rc != 0:
        c.row(f'step time, {name}', f'exit {rc}', 'fail', _tail(out))
        return []
    return iteration_times(work)


def microbatch_cost(c: Any) -> None:
    """MicrobatchDDP's step against MMEngine's DDP, same batch, same ranks."""
    nproc = 2 if c.gpus >= 2 else 1
    fixed = ['scaling.max_batch_per_device=16']  # the same batch for both wrappers
    guard = _step_times(c, 'microbatch', nproc, fixed + ['scaling.on_oom=microbatch'])
    ddp = _step_times(c, 'ddp', nproc, fixed + ['scaling.on_oom=raise'])
    if not (guard and ddp):
        return
    g, d = statistics.median(guard), statistics.median(ddp)
    c.row('MicrobatchDDP vs DDP step', f'{g * 1000:.1f} vs {d * 1000:.1f} ms ({g / d - 1:+.1%})',
          'info', f'{nproc} rank(s), median of {len(guard)} and {len(ddp)} iterations')


def retinanet(c: Any) -> None:
    """The RetinaNet example on this machine's device: mmcv's ops on its tensors."""
    import sys
    sys.path.insert(0, ROOT)
    from mmddp_ext.demo import make_demo_det_dataset
    root = osp.join(c.tmp, 'det')
    make_demo_det_dataset(root, num_train=16, num_val=4, size=128, seed=0)
    root += '/'
    cmd = [
        PYTHON, 'tools/dist_train.py', DET, '--work-dir',
        osp.join(c.tmp, 'retinanet'), '--cfg-options', f'train_dataloader.dataset.data_root={root}',
        f'val_dataloader.dataset.data_root={root}', f'test_dataloader.dataset.data_root={root}',
        f'val_evaluator.ann_file={root}annotations/val.json',
        f'test_evaluator.ann_file={root}annotations/val.json', 'train_cfg.max_epochs=1',
        'train_cfg.val_interval=1', 'train_dataloader.num_workers=0',
        'train_dataloader.persistent_workers=False', 'val_dataloader.num_workers=0',
        'val_dataloader.persistent_workers=False'
    ]
    [(rc, out)] = c.run([cmd], 150)
    ok = rc == 0 and re.search(r'Epoch\(train\)\s*\[1\]', out) and 'coco/bbox_mAP' in out
    c.row('RetinaNet example (mmcv ops on the device)', f'exit {rc}', 'pass' if ok else 'fail',
          'trained 4 iterations and validated (nms)' if ok else _tail(out))


def run_all(c: Any) -> None:
    """Every step of this file, in order."""
    seed_command(c)
    microbatch_cost(c)
    retinanet(c)
