"""When mmcv's ops are for the CPU only and a config trains on a GPU: one line, else none."""
import pytest
from mmengine.config import Config

from mmddp_ext.utils.mmcv_ops import FIX, missing_gpu_ops


@pytest.mark.parametrize(
    'scope, on_gpu, cpu_only, said',
    [
        ('mmdet', True, True, True),  # RetinaNet's focal loss on CUDA tensors would fail
        ('mmdet', True, False, False),  # ops built with CUDA
        ('mmdet', False, True, False),  # training on CPUs: CPU ops are what it needs
        ('mmpose', True, True, False),  # top-down recipes call no compiled op
        (None, True, True, False),
    ])
def test_the_line_is_said_only_where_the_first_iteration_would_fail(scope, on_gpu, cpu_only, said):
    line = missing_gpu_ops(Config(dict(default_scope=scope)), on_gpu, cpu_only)
    assert (line is not None) == said
    if said:
        assert "default_scope='mmdet'" in line and line.endswith(FIX) and '\n' not in line
