"""`dist_train.py CONFIG --explain`: the plan without training, on real installed configs.

The expected plans are worked out here from the configs as written (their ``NxbM`` name or base
batch, per-device batch, LR and schedule) and the rules: the global batch is kept, the
per-device batch is the largest one within the config's that shares it evenly, the LR scales
with global / base, and iteration counts keep the samples seen."""
import json
import os
import subprocess

import pytest

from mmddp_ext.entry.explain import JSON_KEYS
from mmddp_ext.entry.train import main
from mmddp_ext.utils.config import resolve_config_path

from conftest import (DEMO_CONFIG, PYTHON, ROOT, check_ok, demo_options, recipe_expectation, run,
                      written_recipe)

POSE = 'mmpose::body_2d_keypoint/topdown_heatmap/coco/td-hm_hrnet-w32_8xb64-210e_coco-256x192.py'
DET = 'mmdet::faster_rcnn/faster-rcnn_r50-caffe_fpn_ms-90k_coco.py'


@pytest.fixture
def explain(capsys):
    """``--explain --json`` in-process (``mmddp_ext.entry.train.main``, as ``tools/dist_train.py``
    calls it): the JSON it printed. The script itself is run by the tests under
    ``tests/e2e``."""

    def call(config, *extra):
        code = main([config, '--explain', '--json', *extra])
        captured = capsys.readouterr()
        assert code == 0, captured.err[-3000:]
        return json.loads(captured.out.strip().splitlines()[-1])

    return call


def _expected(config, world):
    """The plan for ``world`` processes, from the config as written and the rules
    (:func:`conftest.recipe_expectation`), with the loop it leads to."""
    out = recipe_expectation(config, world)
    loop = written_recipe(config)['cfg'].train_cfg
    iter_based = loop.get('type') == 'IterBasedTrainLoop'
    out.update(train_loop='IterBasedTrainLoop' if iter_based else 'EpochBasedTrainLoop',
               max_iters=round(loop.max_iters * out['iter_scale']) if iter_based else None,
               max_epochs=None if iter_based else loop.max_epochs)
    return out


# The rules of _expected against the docs' worked example: tests/scaling/test_apply.py
# (test_the_worked_example_of_the_docs).


@pytest.mark.parametrize('config, world', [(POSE, 1), (POSE, 2), (POSE, 16), (DET, 1), (DET, 2),
                                           (DET, 16)])
def test_explain_json_on_installed_configs(explain, config, world):
    # the installed file path, as the issue asks; pkg::path is covered below
    info = explain(resolve_config_path(config), '--world-size', str(world))
    assert set(JSON_KEYS) <= set(info)
    assert info['world_size'] == world
    for key, value in _expected(config, world).items():
        assert info[key] == (pytest.approx(value) if isinstance(value,
                                                                (float, list)) else value), key
    assert info['per_device_batch_size'] * world * info['accumulative_counts'] == \
        info['global_batch_size']
    if info['max_iters'] is not None:  # the samples seen are those of the config as written
        w = written_recipe(config)
        assert info['max_iters'] * info['per_device_batch_size'] * world == \
            w['cfg'].train_cfg.max_iters * w['global_batch']
    assert any("runner_type is not set" in w for w in info['warnings'])


def test_explain_accepts_pkg_path_and_cfg_options(explain):
    # a scaling block needs a runner that applies it (--explain refuses it otherwise)
    info = explain(POSE, '--world-size', '2', '--cfg-options', 'runner_type=DDPRunner',
                   'scaling.lr_rule=sqrt', 'scaling.global_batch_size=256')
    w = written_recipe(POSE)
    assert info['global_batch_size'] == 256 and info['lr_rule'] == 'sqrt'
    assert info['lr_scale'] == pytest.approx((256 / w['base'])**0.5)
    assert info['lrs'] == [pytest.approx(w['lr'] * (256 / w['base'])**0.5)]
    assert (w['base'], w['lr']) == (512, 5e-4)


def test_explain_world_size_from_the_environment(explain, monkeypatch):
    for name, value in dict(RANK='0', WORLD_SIZE='4', MASTER_ADDR='127.0.0.1',
                            MASTER_PORT='29500').items():
        monkeypatch.setenv(name, value)
    info = explain(DEMO_CONFIG)
    assert info['world_size'] == 4 and info['per_device_batch_size'] == 8  # 1xb32: 32 / 4
    expect = recipe_expectation(DEMO_CONFIG, 4)
    assert info['per_device_batch_size'] == expect['per_device_batch_size']
    assert not any('runner_type' in w for w in info['warnings'])  # the demo uses DDPRunner


def test_explain_readable_through_the_script():
    """Through the script, as a user types it: the readable plan."""
    out = check_ok(
        run([PYTHON, 'tools/dist_train.py', DEMO_CONFIG, '--explain', '--world-size', '2']))
    assert 'per-GPU batch 16 × 2 GPUs × accumulation 1 = global 32' in out


@pytest.mark.slow
def test_explain_json_is_one_object_on_stdout(demo_data):
    """``--explain --json`` (with the memory forecast) as a program reads it: all of stdout is
    one JSON object; what the libraries print meanwhile (pycocotools, while the node figures
    load two batches) is on stderr."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
    proc = subprocess.run([
        PYTHON, 'tools/dist_train.py', DEMO_CONFIG, '--explain', '--json', '--memory',
        '--world-size', '2', *demo_options(demo_data)
    ], cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout)  # the whole of it
    assert set(JSON_KEYS) <= set(info) and info['world_size'] == 2, info
    assert info['memory']['world_size'] == 2  # the forecast's steps print nothing here
    assert 'loading annotations into memory' in proc.stderr  # the control: it was printed
    assert 'The metainfo config file' not in proc.stderr  # MMPose's known-harmless warning


def test_explain_refusal_is_one_line_and_exit_1(capsys):
    code = main([DEMO_CONFIG, '--explain', '--world-size', '3'])
    captured = capsys.readouterr()
    assert code == 1
    assert captured.err.startswith('[mmddp_ext] error: the global batch 32 (from '
                                   'auto_scale_lr.base_batch_size) is not divisible by world_size '
                                   '3: use 30 or 33')
    assert 'Traceback' not in captured.out + captured.err


def test_auto_scale_lr_flag_keeps_mmengine_per_device_semantics(explain):
    info = explain(POSE, '--world-size', '2', '--auto-scale-lr')
    w = written_recipe(POSE)
    assert info['mode'] == 'per_device'
    # MMEngine's semantics: the written per-device batch on each of 2, its linear LR rule
    assert (info['per_device_batch_size'], info['global_batch_size']) == (64, 128) == \
        (w['batch'], 2 * w['batch'])
    assert info['lr_scale'] == pytest.approx(2 * w['batch'] / w['base']) == 128 / 512


@pytest.fixture(scope='module')
def det_data(tmp_path_factory) -> str:
    from mmddp_ext.demo import make_demo_det_dataset
    out = str(tmp_path_factory.mktemp('demo_det_explain'))
    make_demo_det_dataset(out, num_train=8, num_val=4, size=128, seed=0)
    return out


RETINANET = 'configs/examples/mmdet/retinanet_r18_fpn_1xb4-12e_demo-det-128.py'


@pytest.mark.parametrize('which', ['demo', 'retinanet'])
def test_explain_json_carries_the_node_figures(explain, which, demo_data, det_data):
    """The four figures of a node for 4 processes on it, measured on the config's own data
    with its own DataLoader workers (RetinaNet: 1 image per device, below BatchNorm's 8)."""
    if which == 'demo':
        config, root = DEMO_CONFIG, demo_data
        options = [f'train_dataloader.dataset.data_root={root}/', 'train_dataloader.num_workers=2']
    else:
        config, root = RETINANET, det_data
        options = [f'train_dataloader.dataset.data_root={root}/']
    info = explain(config, '--world-size', '4', '--cfg-options', *options)
    node = info['node']
    assert node['ranks_per_node'] == 4 and node['not_measured'] is None, node
    figures = {f['name']: f for f in node['figures']}
    assert list(figures) == ['host memory', 'shared memory', 'threads', 'batchnorm batch']
    for name in ('host memory', 'shared memory', 'threads'):
        assert figures[name]['need'] is not None and figures[name]['have'] is not None
    # both train their BatchNorms (RetinaNet's example: norm_eval=False) at the plan's batch
    assert figures['batchnorm batch']['have'] == info['per_device_batch_size']
    for figure in figures.values():  # a figure that does not fit is a warning with its fix
        assert (figure['fits'] is False) == any(
            w.startswith(f'{figure["name"]} on each node does not fit') for w in info['warnings'])
