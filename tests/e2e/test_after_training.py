"""After training, as our users go on (docs/after_training.md): MMPose's own APIs, inferencer,
visualizer and ``tools/test.py`` on a checkpoint ``DDPRunner`` wrote (``conftest.trained_demo``),
each in a process that never imports mmddp_ext, with the demo config as a colleague would have
it (no ``custom_imports``, no ``runner_type``)."""
import ast
import glob
import json
import os.path as osp
import pickle
import re

import numpy as np
import pytest
from mmengine.config import Config

from mmddp_ext.checkpoint import load_checkpoint_file

from conftest import DEMO_CONFIG, PYTHON, ROOT, check_ok, demo_options, run
from preloaded import train

READER = osp.join(ROOT, 'tests', 'helpers', 'stock_pose_reader.py')
DET_READER = osp.join(ROOT, 'tests', 'helpers', 'stock_det_reader.py')
DET_CONFIG = osp.join(ROOT, 'configs', 'examples', 'mmdet',
                      'retinanet_r18_fpn_1xb4-12e_demo-det-128.py')
METRIC = re.compile(r'(coco/[^:]+): (-?[0-9.]+)')
DET_METRIC = re.compile(r'(coco/bbox_[^:]+): (-?[0-9.]+)')


def _value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _stock(config: str, options, path: str) -> str:
    """``config`` with ``--cfg-options`` ``options`` applied, as a colleague would have it:
    without our ``custom_imports`` and ``runner_type``."""
    cfg = Config.fromfile(config)
    cfg.merge_from_dict({k: _value(v) for k, v in (o.split('=', 1) for o in options)})
    for ours in ('custom_imports', 'runner_type'):
        cfg.pop(ours)
    cfg.dump(path)
    with open(path) as f:
        text = f.read()
    assert 'mmddp_ext' not in text and 'DDPRunner' not in text
    return path


@pytest.fixture(scope='module')
def stock_config(demo_data, tmp_path_factory) -> str:
    """The demo config with the options the trained run had, without our two lines."""
    options = demo_options(demo_data, max_epochs=2, validate=True)[1:]
    return _stock(DEMO_CONFIG, options,
                  str(tmp_path_factory.mktemp('stock') / 'td-hm_res18_demo_stock.py'))


def _epoch_metrics(log: str, epoch: int) -> dict:
    lines = [ln for ln in log.splitlines() if re.search(rf'Epoch\(val\)\s*\[{epoch}\]', ln)]
    assert lines, log[-3000:]
    return dict(METRIC.findall(lines[-1]))


def _is_image(path: str) -> bool:
    return osp.splitext(path)[1] in ('.jpg', '.png')


def _kind(value) -> str:
    if isinstance(value, np.ndarray):
        return f'ndarray {value.dtype} {list(value.shape)}'
    return type(value).__name__


def _plain(value):
    return json.loads(json.dumps(value, default=lambda a: a.tolist()))


def test_mmpose_apis_read_our_checkpoint_as_a_stock_one(trained_demo, stock_config, demo_data,
                                                        tmp_path):
    """``init_model`` gives the model the dataset's own metainfo (arrays where MMPose has
    arrays) and the trained weights; its visualizer and ``MMPoseInferencer`` write images."""
    work_dir, _ = trained_demo
    ckpt = osp.join(work_dir, 'epoch_2.pth')
    image = sorted(glob.glob(osp.join(demo_data, 'val', '*')))[0]
    out = check_ok(run([PYTHON, READER, stock_config, ckpt, image, str(tmp_path)], cwd='/'))
    report = json.loads(out.split('report ', 1)[1].splitlines()[0])
    assert report['mmddp_ext_imported'] is False
    # what the training dataset had, as our own loader gives it back; MMPose's init_model
    # finds no dataset_meta in the checkpoint and parses the config's metainfo, which lacks
    # only the category list the dataset read from its annotation file (unused by inference)
    trained = load_checkpoint_file(ckpt)['meta']['dataset_meta']
    assert set(trained) - set(report['dataset_meta_kinds']) == {'CLASSES'}
    trained = {k: v for k, v in trained.items() if k != 'CLASSES'}
    assert report['dataset_meta_kinds'] == {k: _kind(v) for k, v in trained.items()}
    assert report['dataset_meta'] == _plain(trained)
    assert report['state_dict_equal'] is True
    assert report['keypoints_shape'] == [1, trained['num_keypoints'], 2]
    assert report['inferencer_people'] == 1
    images = {name: size for name, size in report['written'].items() if _is_image(name)}
    assert 'init_model_vis.jpg' in images and any(n.startswith('inferencer/') for n in images)
    assert all(size > 0 for size in images.values()), images


def test_mmpose_tools_test_py_gives_the_metrics_our_validation_logged(trained_demo, stock_config,
                                                                      demo_data, tmp_path):
    """MMPose's ``tools/test.py --dump --show-dir`` on our checkpoint: the same COCO metrics as
    our run's validation of that epoch, every prediction dumped, every image drawn."""
    import mmpose
    work_dir, log = trained_demo
    test_py = osp.join(osp.dirname(mmpose.__file__), '.mim', 'tools', 'test.py')
    dump = tmp_path / 'predictions.pkl'
    out = check_ok(
        run([
            PYTHON, test_py, stock_config,
            osp.join(work_dir, 'epoch_2.pth'), '--work-dir',
            str(tmp_path / 'w'), '--dump',
            str(dump), '--show-dir', 'vis'
        ], cwd='/'))
    assert 'mmddp_ext' not in out
    ours, stock = _epoch_metrics(log, 2), dict(METRIC.findall(out))
    assert ours and stock == ours, (ours, stock)
    with open(val_json := osp.join(demo_data, 'annotations', 'val.json')) as f:
        images = len(json.load(f)['images'])
    with open(dump, 'rb') as f:
        assert len(pickle.load(f)) == images, val_json
    drawn = [p for p in glob.glob(str(tmp_path / 'w' / '*' / 'vis' / '*')) if _is_image(p)]
    assert len(drawn) == images and all(osp.getsize(p) > 0 for p in drawn), drawn


@pytest.mark.slow
def test_mmdetection_reads_our_retinanet_checkpoint_as_a_stock_one(tmp_path):
    """Our RetinaNet example trained one epoch by our entry; then, without mmddp_ext,
    ``init_detector`` gets the classes and palette as the dataset has them and the trained
    weights, ``DetInferencer`` writes a drawn image and MMDetection's ``tools/test.py`` gives the
    metrics our validation logged."""
    import mmdet

    from mmddp_ext.demo import make_demo_det_dataset
    data = str(tmp_path / 'det')
    make_demo_det_dataset(data, num_train=8, num_val=4, size=128, seed=0)
    work = str(tmp_path / 'w')
    # One epoch of warm-up scores every anchor near the prior (0.01), below the config's 0.05:
    # a threshold of 0 keeps boxes, so both evaluations have predictions to score.
    options = demo_options(data, max_epochs=1, validate=True, slim=False,
                           **{'model.test_cfg.score_thr': '0.0'})
    log = check_ok(train([DET_CONFIG, '--work-dir', work, *options], str(tmp_path / 'out')))
    stock = _stock(DET_CONFIG, options[1:], str(tmp_path / 'retinanet_stock.py'))
    ckpt = osp.join(work, 'epoch_1.pth')
    image = sorted(glob.glob(osp.join(data, 'val', '*')))[0]
    out = check_ok(run([PYTHON, DET_READER, stock, ckpt, image, str(tmp_path / 'o')], cwd='/'))
    report = json.loads(out.split('report ', 1)[1].splitlines()[0])
    assert report['mmddp_ext_imported'] is False and report['state_dict_equal'] is True
    trained = load_checkpoint_file(ckpt)['meta']['dataset_meta']
    assert report['dataset_meta_kinds'] == {k: type(v).__name__ for k, v in trained.items()}
    assert report['dataset_meta'] == json.loads(json.dumps(trained))
    assert report['predicted_boxes'] > 0
    drawn = {n: size for n, size in report['written'].items() if n.startswith('vis/')}
    assert drawn and all(size > 0 for size in drawn.values()), report['written']
    test_py = osp.join(osp.dirname(mmdet.__file__), '.mim', 'tools', 'test.py')
    tested = check_ok(
        run([PYTHON, test_py, stock, ckpt, '--work-dir',
             str(tmp_path / 't')], cwd='/'))
    ours = dict(DET_METRIC.findall([ln for ln in log.splitlines() if 'Epoch(val)' in ln][-1]))
    assert ours and dict(DET_METRIC.findall(tested)) == ours
