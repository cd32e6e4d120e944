"""Shared fixtures: the repository root, a small demo dataset, and a subprocess runner."""
import os
import os.path as osp
import subprocess
import sys
from typing import Dict, List, Optional

import pytest

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEMO_CONFIG = osp.join(ROOT, 'configs', 'demo', 'td-hm_res18_1xb32-30e_demo-64x64.py')


@pytest.fixture(scope='session')
def demo_data(tmp_path_factory) -> str:
    """A small demo dataset (64 train / 16 val images), shared by the training tests."""
    from mmddp_ext.demo import make_demo_dataset
    out = str(tmp_path_factory.mktemp('demo_coco'))
    make_demo_dataset(out, num_train=64, num_val=16, size=96, seed=0)
    return out


def demo_options(data_root: str, max_epochs: int = 2, **extra: str) -> List[str]:
    """``--cfg-options`` that point the demo config at ``data_root`` and shorten it."""
    root = data_root.rstrip('/') + '/'
    opts = {
        'train_dataloader.dataset.data_root': root,
        'val_dataloader.dataset.data_root': root,
        'test_dataloader.dataset.data_root': root,
        'val_evaluator.ann_file': root + 'annotations/val.json',
        'test_evaluator.ann_file': root + 'annotations/val.json',
        'train_cfg.max_epochs': str(max_epochs),
        'train_cfg.val_interval': str(max_epochs),
        'default_hooks.checkpoint.interval': '1',
        'default_hooks.checkpoint.max_keep_ckpts': '-1',
        'default_hooks.logger.interval': '1',
        'train_dataloader.num_workers': '0',
        'train_dataloader.persistent_workers': 'False',
        'val_dataloader.num_workers': '0',
        'val_dataloader.persistent_workers': 'False',
        'test_dataloader.num_workers': '0',
        'test_dataloader.persistent_workers': 'False',
    }
    opts.update(extra)
    return ['--cfg-options'] + [f'{k}={v}' for k, v in opts.items()]


def run(cmd: List[str], timeout: float = 600, env: Optional[Dict[str, str]] = None,
        cwd: str = ROOT) -> subprocess.CompletedProcess:
    """Run a command to completion; output captured as text (stdout + stderr merged)."""
    full_env = dict(os.environ, PYTHONUNBUFFERED='1', OMP_NUM_THREADS='1',
                    PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
    full_env.update(env or {})
    return subprocess.run(cmd, cwd=cwd, env=full_env, timeout=timeout, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def popen(cmd: List[str], env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
    """Start a command in the repository root; launcher variables are removed unless given."""
    full = dict(os.environ, PYTHONUNBUFFERED='1', OMP_NUM_THREADS='1',
                PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
    for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT'):
        full.pop(k, None)
    full.update(env or {})
    return subprocess.Popen(cmd, cwd=ROOT, env=full, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)


def finish(procs: List[subprocess.Popen], timeout: float = 600) -> List:
    """Wait for every process; ``[(returncode, output), ...]``."""
    return [_wait(p, timeout) for p in procs]


def _wait(proc: subprocess.Popen, timeout: float):
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def check_ok(proc: subprocess.CompletedProcess) -> str:
    """Assert a zero exit; on failure show the tail of the output."""
    assert proc.returncode == 0, f'exit {proc.returncode}; output tail:\n{proc.stdout[-6000:]}'
    return proc.stdout


PYTHON = sys.executable


def demo_with_hooks(tmp_path, hooks: str, modules=(), name: str = 'demo_hooks.py') -> str:
    """A config file: the demo plus ``custom_hooks`` (Python source of the list's items) and
    the test-helper modules that define them."""
    path = osp.join(str(tmp_path), name)
    imports = ['mmddp_ext'] + [f'tests.helpers.{m}' for m in modules]
    with open(path, 'w') as f:
        f.write(f"_base_ = [{DEMO_CONFIG!r}]\n"
                f"custom_imports = dict(imports={imports!r}, allow_failed_imports=False)\n"
                f"custom_hooks = [dict(type='SyncBuffersHook'), {hooks}]\n")
    return path


def recording_config(tmp_path, record_dir: str) -> str:
    """The demo config plus :class:`RankRecordHook` writing to ``record_dir``."""
    return demo_with_hooks(tmp_path, f"dict(type='RankRecordHook', out_dir={record_dir!r})",
                           ['rank_record_hook'], 'demo_recorded.py')


def read_records(record_dir: str) -> dict:
    """``{rank: record}`` written by RankRecordHook."""
    import glob
    import json
    out = {}
    for p in glob.glob(osp.join(record_dir, 'rank*.json')):
        rec = json.load(open(p))
        out[rec['dist_rank']] = rec
    return out


def written_recipe(config: str) -> dict:
    """What a recipe config says as written, read with MMEngine alone (no planning code):
    ``cfg``, the per-device ``batch``, the ``base`` batch of ``auto_scale_lr``, the
    ``global_batch`` it was written for (N × M of its ``NxbM`` name, else the base batch) and
    the optimizer's ``lr``."""
    import re

    from mmengine.config import Config

    from mmddp_ext.utils.config import resolve_config_path
    path = resolve_config_path(config)
    cfg = Config.fromfile(path)
    named = re.search(r'(?:^|[_-])(\d+)xb(\d+)(?:[_-]|\.py$)', osp.basename(path))
    base = (cfg.get('auto_scale_lr') or {}).get('base_batch_size')
    return dict(cfg=cfg, batch=cfg.train_dataloader.batch_size, base=base,
                global_batch=int(named[1]) * int(named[2]) if named else base,
                lr=cfg.optim_wrapper.optimizer.lr)


def recipe_expectation(config: str, world: int) -> dict:
    """The plan a recipe config implies on ``world`` processes, from the rules alone: the
    global batch is kept; the per-device batch is the largest one within the written batch
    that splits global / world evenly, the rest is accumulation; the LR scales linearly with
    global / base; iteration counts are multiplied by ``iter_scale`` = samples per iteration
    as written / now, so that the samples seen stay the same."""
    w = written_recipe(config)
    global_batch = w['global_batch']
    per_rank = global_batch // world
    per_device = max(d for d in range(1, min(w['batch'], per_rank) + 1) if per_rank % d == 0)
    return dict(per_device_batch_size=per_device, accumulative_counts=per_rank // per_device,
                global_batch_size=global_batch, base_batch_size=w['base'],
                lr_scale=global_batch / w['base'], lrs=[w['lr'] * global_batch / w['base']],
                iter_scale=global_batch / (per_device * world))
