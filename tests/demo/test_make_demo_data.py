"""``tools/make_demo_data.py``, as the README's first command runs it (in a fresh folder, so the
default output paths are the ones the configs read)."""
import json
import os
import os.path as osp
import shutil
import subprocess
import sys

import pytest

from mmddp_ext.demo import make_demo_dataset, make_demo_det_dataset
from mmddp_ext.utils.config import load_config

from conftest import ROOT

SCRIPT = osp.join(ROOT, 'tools', 'make_demo_data.py')


def _tool(cwd, *args):
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=str(cwd), capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))


def _files(root):
    out = {}
    for split in ('train', 'val'):
        with open(osp.join(root, 'annotations', f'{split}.json')) as f:
            out[split] = json.load(f)
    return out


@pytest.mark.parametrize('task, default_out, maker', [
    ('pose', 'data/demo_coco', make_demo_dataset),
    ('det', 'data/demo_det', make_demo_det_dataset),
])
def test_writes_where_the_configs_read_the_same_as_the_library(tmp_path, task, default_out, maker):
    proc = _tool(tmp_path, '--task', task, '--num-train', '6', '--num-val', '2', '--size', '64',
                 '--seed', '5')
    assert proc.returncode == 0, proc.stderr[-3000:]
    root = tmp_path / default_out
    assert f'wrote 6 train + 2 val {task} images of 64x64 to {default_out}' in proc.stdout
    got = _files(root)
    assert [len(got[s]['images']) for s in ('train', 'val')] == [6, 2]
    # the configs' data root is this path (relative to where the command runs)
    config = ('configs/demo/td-hm_res18_1xb32-30e_demo-64x64.py' if task == 'pose' else
              'configs/examples/mmdet/retinanet_r18_fpn_1xb4-12e_demo-det-128.py')
    assert load_config(osp.join(ROOT, config)).data_root == default_out + '/'
    # the same files as the library function with the same arguments
    maker(str(tmp_path / 'lib'), num_train=6, num_val=2, size=64, seed=5)
    assert _files(tmp_path / 'lib') == got
    shutil.rmtree(tmp_path / 'lib')


def test_a_bad_value_is_named(tmp_path):
    proc = _tool(tmp_path, '--num-train', '0')
    assert proc.returncode == 2 and 'error: num_train' in proc.stderr, proc.stderr
    assert 'Traceback' not in proc.stderr
