"""The entry points users already have, on a config that asks for DDPRunner (the demo: it has
``custom_imports`` plus ``runner_type``): MMPose's own ``tools/train.py`` (``Runner.from_cfg``)
and ``tools/dist_train.sh`` (``torch.distributed.launch --launcher pytorch``), as installed
with mmpose, on a CPU. Each must get the plan and both hooks."""
import os.path as osp
import re

import pytest

from mmddp_launch.rendezvous import find_free_port

from conftest import DEMO_CONFIG, PYTHON, check_ok, demo_options, run


def _mmpose_tools() -> str:
    import mmpose
    return osp.join(osp.dirname(mmpose.__file__), '.mim', 'tools')


def _check_planned(out: str, world: int) -> None:
    per_device = 32 // world
    gpus = 'GPUs' if world > 1 else 'GPU'
    assert (f'plan            per-GPU batch {per_device} × {world} {gpus} × accumulation 1 = '
            f'global 32') in out
    assert re.search(r'\(VERY_HIGH\s*\) ScalingHook', out)  # MMEngine's hook table
    assert re.search(r'\(NORMAL\s*\) RankMemoryHook', out)
    iters = 64 // 32  # 64 images, global batch 32
    assert f'Epoch(train) [1][{iters}/{iters}]' in out


@pytest.mark.slow
def test_mmpose_train_py_builds_the_configs_runner(demo_data, tmp_path):
    """... and honours our ``default_hooks`` keys: ``hang_watchdog=None`` removes the watchdog
    (the positive control: the dist_train.sh test below still has it)."""
    out = check_ok(
        run([
            PYTHON,
            osp.join(_mmpose_tools(), 'train.py'), DEMO_CONFIG, '--work-dir',
            str(tmp_path / 'w'),
            *demo_options(demo_data, 1, **{'default_hooks.hang_watchdog': 'None'})
        ], cwd=str(tmp_path)))
    _check_planned(out, 1)
    assert 'HangWatchdogHook' not in out


@pytest.mark.slow
def test_mmpose_dist_train_sh_on_cpu(demo_data, tmp_path):
    out = check_ok(
        run([
            'bash',
            osp.join(_mmpose_tools(), 'dist_train.sh'), DEMO_CONFIG, '2', '--work-dir',
            str(tmp_path / 'w'), *demo_options(demo_data, 1)
        ], cwd=str(tmp_path), env=dict(PORT=str(find_free_port()))))
    _check_planned(out, 2)
    assert out.count('[mmddp_ext] process group: gloo') == 2  # one per rank, on a CPU
    assert re.search(r'\(VERY_HIGH\s*\) HangWatchdogHook', out)
