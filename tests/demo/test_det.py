"""The coloured-shapes detection data and the MMDetection example config that trains on it."""
import glob
import hashlib
import os.path as osp
import re

import cv2
import numpy as np
import pytest
from pycocotools.coco import COCO

from mmddp_ext.demo import CLASSES, make_demo_det_dataset

from conftest import ROOT

DET_CONFIG = osp.join(ROOT, 'configs', 'examples', 'mmdet',
                      'retinanet_r18_fpn_1xb4-12e_demo-det-128.py')
# Per class, the BGR channel its colour family is dominated by.
DOMINANT = {'square': 2, 'circle': 1, 'triangle': 0}


@pytest.fixture(scope='module')
def det_data(tmp_path_factory) -> str:
    """24 train / 8 val images at 128x128, shared by this module."""
    out = str(tmp_path_factory.mktemp('demo_det'))
    make_demo_det_dataset(out, num_train=24, num_val=8, size=128, seed=0)
    return out


def _digest(root: str) -> str:
    h = hashlib.sha256()
    for path in sorted(glob.glob(osp.join(root, '*', '*'))):
        h.update(osp.relpath(path, root).encode())
        h.update(open(path, 'rb').read())
    return h.hexdigest()


def test_valid_coco_with_boxes_inside_images(det_data):
    for split, n in (('train', 24), ('val', 8)):
        coco = COCO(osp.join(det_data, 'annotations', f'{split}.json'))
        assert [(c['id'], c['name']) for c in coco.loadCats(coco.getCatIds())] == \
            list(enumerate(CLASSES, start=1))
        assert len(coco.getImgIds()) == n
        for img in coco.loadImgs(coco.getImgIds()):
            assert cv2.imread(osp.join(det_data, split, img['file_name'])).shape == (128, 128, 3)
            anns = coco.loadAnns(coco.getAnnIds(imgIds=img['id']))
            assert 1 <= len(anns) <= 4
            for ann in anns:
                x, y, w, h = ann['bbox']
                assert ann['iscrowd'] == 0 and ann['category_id'] in (1, 2, 3)
                assert w > 0 and h > 0 and x >= 0 and y >= 0
                assert x + w <= img['width'] and y + h <= img['height']
                assert 0 < ann['area'] <= w * h


def test_shapes_are_drawn_inside_their_boxes(det_data):
    """The pixel at each box centre has its class's colour, not the greyish background."""
    coco = COCO(osp.join(det_data, 'annotations', 'train.json'))
    seen = set()
    for ann in coco.loadAnns(coco.getAnnIds()):
        name = CLASSES[ann['category_id'] - 1]
        img = coco.loadImgs(ann['image_id'])[0]
        pixels = cv2.imread(osp.join(det_data, 'train', img['file_name'])).astype(int)
        x, y, w, h = ann['bbox']
        centre = pixels[int(y + h / 2), int(x + w / 2)]
        others = np.delete(centre, DOMINANT[name])
        assert centre[DOMINANT[name]] > others.max() + 60, (name, ann, centre)
        # exact boxes: the shape touches every side of its box
        box = pixels[int(y):int(y + h), int(x):int(x + w), DOMINANT[name]]
        for edge in (box[0], box[-1], box[:, 0], box[:, -1]):
            assert edge.max() > 150, (name, ann)
        seen.add(name)
    assert seen == set(CLASSES)


def test_deterministic_for_a_seed(tmp_path):
    a, b, c, d = (str(tmp_path / n) for n in 'abcd')
    make_demo_det_dataset(a, num_train=4, num_val=2, size=64, seed=3)
    make_demo_det_dataset(b, num_train=4, num_val=2, size=64, seed=3)
    make_demo_det_dataset(c, num_train=4, num_val=2, size=64, seed=4)
    assert _digest(a) == _digest(b) != _digest(c)
    # val does not depend on how many training images were drawn
    make_demo_det_dataset(d, num_train=5, num_val=2, size=64, seed=3)
    assert open(osp.join(a, 'annotations', 'val.json')).read() == \
        open(osp.join(d, 'annotations', 'val.json')).read()
    assert not glob.glob(osp.join(a, 'annotations', '*.tmp'))


@pytest.mark.parametrize('kwargs, message',
                         [(dict(num_train=0), 'num_train must be a positive integer, got 0'),
                          (dict(num_val=2.5), 'num_val must be a positive integer, got 2.5'),
                          (dict(size=16), 'size=16'),
                          (dict(seed=-1), 'seed must be a non-negative integer, got -1')])
def test_bad_arguments_are_named(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        make_demo_det_dataset(str(tmp_path), **kwargs)


def test_config_matches_its_name_and_the_data():
    from mmddp_ext.utils.config import load_config
    cfg = load_config(DET_CONFIG)
    batch = int(re.search(r'_1xb(\d+)-', osp.basename(DET_CONFIG)).group(1))
    assert cfg.train_dataloader.batch_size == cfg.auto_scale_lr.base_batch_size == batch
    assert cfg.model.backbone.depth == 18 and cfg.model.backbone.init_cfg is None
    assert cfg.model.bbox_head.num_classes == len(CLASSES)
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        assert tuple(cfg[loader].dataset.metainfo.classes) == CLASSES
    assert cfg.val_evaluator.type == 'CocoMetric' and cfg.val_evaluator.metric == 'bbox'


# Training this config on 2 processes, with the plan applied to the data loading:
# tests/e2e/test_mmdet_entry.py (test_mmdet_dist_train_sh_on_cpu, through MMDetection's own
# dist_train.sh).
