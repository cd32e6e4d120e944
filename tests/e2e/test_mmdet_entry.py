"""MMDetection's own ``tools/train.py`` and ``tools/dist_train.sh``, as installed with mmdet 3.3.0,
on our RetinaNet example config (it sets ``custom_imports`` and ``runner_type='DDPRunner'``) and
the demo detection data, on a CPU. MMDetection builds the runner with ``RUNNERS.build(cfg)``, so
each must get the plan and both hooks, and train."""
import glob
import json
import math
import os.path as osp
import re

import pytest
import torch

from mmddp_launch.rendezvous import find_free_port

from conftest import PYTHON, ROOT, check_ok, demo_options, run

DET_CONFIG = osp.join(ROOT, 'configs', 'examples', 'mmdet',
                      'retinanet_r18_fpn_1xb4-12e_demo-det-128.py')
NUM_TRAIN = 24


@pytest.fixture(scope='module')
def det_data(tmp_path_factory) -> str:
    """24 train / 8 val images at 128x128."""
    from mmddp_ext.demo import make_demo_det_dataset
    out = str(tmp_path_factory.mktemp('demo_det_entry'))
    make_demo_det_dataset(out, num_train=NUM_TRAIN, num_val=8, size=128, seed=0)
    return out


def _mmdet_tools() -> str:
    import mmdet
    return osp.join(osp.dirname(mmdet.__file__), '.mim', 'tools')


def _check_trained(out: str, world: int) -> None:
    global_batch = 4  # 1xb4: the name's and the LR's batch
    per_device = global_batch // world
    gpus = 'GPUs' if world > 1 else 'GPU'
    assert (f'plan            per-GPU batch {per_device} × {world} {gpus} × accumulation 1 = '
            f'global {global_batch}') in out, out[-6000:]
    assert re.search(r'\(VERY_HIGH\s*\) ScalingHook', out)  # MMEngine's hook table
    assert re.search(r'\(NORMAL\s*\) RankMemoryHook', out)
    iters = math.ceil(NUM_TRAIN / global_batch)
    lines = re.findall(r'Epoch\(train\)\s*\[1\]\[\s*(\d+)/(\d+)\].*?\bloss: (\S+)', out)
    assert lines and {int(total) for _, total, _ in lines} == {iters}, lines
    assert max(int(i) for i, _, _ in lines) == iters
    assert all(math.isfinite(float(loss)) for _, _, loss in lines), lines
    assert 'coco/bbox_mAP' in out  # validation ran with CocoMetric


@pytest.mark.slow
def test_mmdet_train_py_builds_the_configs_runner(det_data, tmp_path):
    work = tmp_path / 'w'
    out = check_ok(
        run([
            PYTHON,
            osp.join(_mmdet_tools(), 'train.py'), DET_CONFIG, '--work-dir',
            str(work), *demo_options(det_data, 1, validate=True, slim=False)
        ], cwd=str(tmp_path)))
    _check_trained(out, 1)
    assert osp.isfile(work / 'epoch_1.pth')


@pytest.mark.slow
def test_mmdet_dist_train_sh_on_cpu(det_data, tmp_path):
    """MMDetection's own dist_train.sh, 2 processes: the plan really drives the data loading.
    The global batch of the name (1xb4) is kept, so each rank loads global / world per iteration
    and an epoch of the training images takes images / global iterations (MMEngine's own
    per-device semantics would take half as many); the checkpoint records the plan; the
    BatchNorms that see 2 images per device are warned of."""
    work_dir = str(tmp_path / 'w')
    out = check_ok(
        run([
            'bash',
            osp.join(_mmdet_tools(), 'dist_train.sh'), DET_CONFIG, '2', '--work-dir', work_dir,
            *demo_options(det_data, 1, validate=True, slim=False)
        ], cwd=str(tmp_path), env=dict(PORT=str(find_free_port()))))
    _check_trained(out, 2)
    assert out.count('[mmddp_ext] process group: gloo') == 2  # one per rank, on a CPU
    assert '(the config was tuned for 4)' in out
    # its ResNet's BatchNorms train (norm_eval=False) on 2 images per device: warned of once,
    # before the first iteration, with SyncBN as the fix (MMPose's demo: test_batchnorm_batch)
    warned = re.findall(
        r'BatchNorm: (\d+) layer\(s\) that train normalise over 2 sample\(s\) '
        r"each step, below 8.*sync_bn='torch'", out)
    assert len(warned) == 1 and int(warned[0]) > 0, out[-4000:]
    images = len(json.load(open(osp.join(det_data, 'annotations', 'train.json')))['images'])
    iters = math.ceil(images / 4)
    assert iters == 6  # 24 images, global 4: not 12, as 2 per device would give
    ckpt = torch.load(osp.join(work_dir, 'epoch_1.pth'), map_location='cpu', weights_only=False)
    assert ckpt['meta']['iter'] == iters and ckpt['meta']['epoch'] == 1
    assert ckpt['meta']['scaling_plan']['world_size'] == 2
    assert ckpt['meta']['scaling_plan']['global_batch_size'] == 4
    [scalars] = glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json'))
    records = [r for r in map(json.loads, open(scalars)) if 'loss' in r]
    assert len(records) == iters and all(math.isfinite(r['loss']) for r in records)
    assert not osp.exists(osp.join(work_dir, 'failures'))
