"""Evaluation on any number of ranks: MMPose's and MMDetection's own ``tools/test.py`` under
torchrun (``--launcher pytorch``), on our configs, which build our ``DDPRunner`` through their
``runner_type``, and on our checkpoints (``conftest.trained_demo``; RetinaNet trained here), with
a val set of 77 images that no world size divides. On 3 ranks the training plans (global
batches of 32 and 4) do not fit, and nothing trains: no rank refuses. On 1, 2 and 3 ranks the
metrics are the same to the last digit printed and every image is predicted once, the same
prediction on each (one image per forward, so that the world size changes no batch)."""
import ast
import os.path as osp
import pickle
import re

import numpy as np
import pytest
from mmengine.config import Config

from mmddp_launch.rendezvous import find_free_port

from conftest import DEMO_CONFIG, PYTHON, ROOT, check_ok, demo_options, once, run
from preloaded import train

METRIC = re.compile(r'(coco/[^:]+): (-?[0-9.]+)')
VAL_IMAGES = 77  # 77 = 7 x 11: neither 2 nor 3 divides it


@pytest.fixture(scope='module')
def val_77(tmp_path_factory) -> str:
    from mmddp_ext.demo import make_demo_dataset
    return once(
        tmp_path_factory, 'demo_coco_val77',
        lambda out: make_demo_dataset(out, num_train=8, num_val=VAL_IMAGES, size=96, seed=3))


def _test_py() -> str:
    import mmpose
    return osp.join(osp.dirname(mmpose.__file__), '.mim', 'tools', 'test.py')


def _config(data: str, tmp_path) -> str:
    """The demo config with the trained run's options and the 77-image val set, written as a
    file (MMPose's ``--cfg-options`` cannot set the slim model's tuple): ``custom_imports`` and
    ``runner_type='DDPRunner'`` kept."""
    cfg = Config.fromfile(DEMO_CONFIG)
    options = demo_options(data, max_epochs=2, validate=True)[1:]
    cfg.merge_from_dict({k: _value(v) for k, v in (o.split('=', 1) for o in options)})
    # one image per forward: the float sums of a convolution depend on the batch it is in (a
    # 2-epoch model's flat heatmaps turn that into a different argmax now and then), and the
    # batches differ with the world size; the sampler still pads 77 to 78 on 2 and 3 ranks
    cfg.test_dataloader.batch_size = 1
    assert cfg.runner_type == 'DDPRunner'
    path = str(tmp_path / 'demo_val77.py')
    cfg.dump(path)
    return path


def _value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _evaluate(world: int, config: str, checkpoint: str, tmp_path) -> tuple:
    dump = str(tmp_path / f'predictions_{world}.pkl')
    out = check_ok(
        run([
            PYTHON, '-m', 'torch.distributed.run', f'--nproc_per_node={world}',
            f'--master_port={find_free_port()}',
            _test_py(), config, checkpoint, '--launcher', 'pytorch', '--work-dir',
            str(tmp_path / f'w{world}'), '--dump', dump
        ], cwd=str(tmp_path)))
    with open(dump, 'rb') as f:
        return out, dict(METRIC.findall(out)), pickle.load(f)


def _by_image(predictions: list) -> dict:
    return {p['img_id']: np.asarray(p['pred_instances']['keypoints']) for p in predictions}


@pytest.mark.slow
def test_mmpose_test_py_gives_the_same_metrics_on_1_2_and_3_ranks(trained_demo, val_77, tmp_path):
    checkpoint = osp.join(trained_demo[0], 'epoch_2.pth')
    config = _config(val_77, tmp_path)
    results = {world: _evaluate(world, config, checkpoint, tmp_path) for world in (1, 2, 3)}
    out_3, metrics_1 = results[3][0], results[1][1]
    assert 'ScalingError' not in out_3 and 'Traceback' not in out_3
    assert 'test_dataloader.sampler is' not in out_3  # DefaultSampler: no padding warning
    assert 'Epoch(test) [26/26]' in out_3  # 77 padded to 78: 26 images per rank
    assert metrics_1 and len(metrics_1) >= 10, results[1][0][-3000:]
    for world in (2, 3):
        assert results[world][1] == metrics_1, (world, results[world][1], metrics_1)
    one = _by_image(results[1][2])
    assert len(results[1][2]) == len(one) == VAL_IMAGES
    for world in (2, 3):
        predictions = results[world][2]
        assert len(predictions) == VAL_IMAGES  # the padded samples are not counted twice
        theirs = _by_image(predictions)
        assert theirs.keys() == one.keys()
        for image, keypoints in one.items():
            np.testing.assert_allclose(theirs[image], keypoints, rtol=0, atol=1e-4)


DET_CONFIG = osp.join(ROOT, 'configs', 'examples', 'mmdet',
                      'retinanet_r18_fpn_1xb4-12e_demo-det-128.py')
DET_METRIC = re.compile(r'(coco/bbox_[^:]+): (-?[0-9.]+)')


def _det_evaluate(world: int, config: str, checkpoint: str, tmp_path) -> tuple:
    import mmdet
    test_py = osp.join(osp.dirname(mmdet.__file__), '.mim', 'tools', 'test.py')
    dump = str(tmp_path / f'detections_{world}.pkl')
    out = check_ok(
        run([
            PYTHON, '-m', 'torch.distributed.run', f'--nproc_per_node={world}',
            f'--master_port={find_free_port()}', test_py, config, checkpoint, '--launcher',
            'pytorch', '--work-dir',
            str(tmp_path / f'd{world}'), '--out', dump
        ], cwd=str(tmp_path)))
    with open(dump, 'rb') as f:
        return out, dict(DET_METRIC.findall(out)), pickle.load(f)


@pytest.mark.slow
def test_mmdetection_test_py_gives_the_same_metrics_on_1_2_and_3_ranks(tmp_path):
    from mmddp_ext.demo import make_demo_det_dataset
    data = str(tmp_path / 'det')
    make_demo_det_dataset(data, num_train=8, num_val=VAL_IMAGES, size=128, seed=0)
    # one epoch scores every anchor near the prior (0.01): a threshold of 0 keeps boxes to score
    options = demo_options(data, max_epochs=1, slim=False, **{'model.test_cfg.score_thr': '0.0'})
    work = str(tmp_path / 'w')
    check_ok(train([DET_CONFIG, '--work-dir', work, *options], str(tmp_path / 'out')))
    cfg = Config.fromfile(DET_CONFIG)
    cfg.merge_from_dict({k: _value(v) for k, v in (o.split('=', 1) for o in options[1:])})
    cfg.test_dataloader.batch_size = 1  # as above: the world size changes no batch
    config = str(tmp_path / 'retinanet_val77.py')
    cfg.dump(config)
    checkpoint = osp.join(work, 'epoch_1.pth')
    results = {world: _det_evaluate(world, config, checkpoint, tmp_path) for world in (1, 2, 3)}
    assert 'Traceback' not in results[3][0]
    metrics_1 = results[1][1]
    assert len(metrics_1) >= 6, results[1][0][-3000:]  # after one epoch often all 0.0000:
    one = {p['img_id']: p['pred_instances'] for p in results[1][2]}
    assert len(one) == len(results[1][2]) == VAL_IMAGES
    # the predictions are compared, then: boxes on every image (score threshold 0)
    assert all(len(pred['scores']) > 0 for pred in one.values())
    for world in (2, 3):
        assert results[world][1] == metrics_1, (world, results[world][1], metrics_1)
        theirs = {p['img_id']: p['pred_instances'] for p in results[world][2]}
        assert len(results[world][2]) == VAL_IMAGES and theirs.keys() == one.keys()
        for image, pred in one.items():
            for key in ('bboxes', 'scores', 'labels'):
                np.testing.assert_allclose(
                    np.asarray(theirs[image][key]), np.asarray(pred[key]), rtol=0, atol=1e-4,
                    err_msg=f'{image} {key}')
