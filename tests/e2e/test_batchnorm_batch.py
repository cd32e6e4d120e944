"""The batch each BatchNorm sees, warned before the first iteration on a real recipe (MMPose's
top-down heatmap demo, its ResNet's BatchNorms train): global batch 8 on 2 processes (started by
hand from the preloaded stack, ``tests/preloaded.py``) gives each rank 4 samples, below 8, and
rank 0 says so once, with SyncBN as the fix; at 16 per device it says nothing. MMDetection's
RetinaNet example is the other family (tests/e2e/test_mmdet_entry.py)."""
import re

import pytest

from conftest import DEMO_CONFIG, DEMO_WORKERS, check_ok, demo_options
from preloaded import dist_train

WARNING = re.compile(r'BatchNorm: (\d+) layer\(s\) that train normalise over (\d+) sample\(s\) '
                     r'each step, below 8.*SyncBN')


@pytest.mark.slow
@pytest.mark.parametrize('global_batch, per_device', [(8, 4), (32, 16)])
def test_the_demos_batchnorms_are_warned_of_below_8_per_device(demo_data, tmp_path, global_batch,
                                                               per_device):
    out = check_ok(
        dist_train([
            DEMO_CONFIG, '--work-dir',
            str(tmp_path / 'w'),
            *demo_options(demo_data, 1, **{
                'scaling.global_batch_size': str(global_batch),
                **DEMO_WORKERS
            })
        ], 2, str(tmp_path / 'ranks')))
    assert f'per-GPU batch {per_device} × 2 GPUs' in out, out[-4000:]
    found = WARNING.findall(out)
    if per_device >= 8:
        assert found == []
        return
    assert len(found) == 1, out[-4000:]  # once, on rank 0
    layers, samples = (int(n) for n in found[0])
    assert samples == per_device and layers > 0
    assert WARNING.search(out).start() < out.index('Epoch(train)')  # before the first iteration
