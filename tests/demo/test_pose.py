"""The demo data generator writes valid, exact, deterministic COCO keypoint data."""
import hashlib
import json
import os.path as osp

import cv2
import numpy as np
import pytest
from xtcocotools.coco import COCO

from mmddp_ext.demo import KEYPOINT_NAMES, make_demo_dataset


def _digest(root):
    h = hashlib.sha256()
    for split in ('train', 'val'):
        h.update(open(osp.join(root, 'annotations', f'{split}.json'), 'rb').read())
        h.update(open(osp.join(root, split, '000000.png'), 'rb').read())
    return h.hexdigest()


def test_valid_coco_with_keypoints_inside_images(demo_data):
    for split, n in (('train', 64), ('val', 16)):
        coco = COCO(osp.join(demo_data, 'annotations', f'{split}.json'))
        assert len(coco.getImgIds()) == n and len(coco.getAnnIds()) == n
        cat = coco.loadCats(1)[0]
        assert cat['name'] == 'person' and tuple(cat['keypoints']) == KEYPOINT_NAMES
        for ann in coco.loadAnns(coco.getAnnIds()):
            img = coco.loadImgs(ann['image_id'])[0]
            assert cv2.imread(osp.join(demo_data, split, img['file_name'])).shape == (96, 96, 3)
            kp = np.array(ann['keypoints']).reshape(17, 3)
            vis = kp[kp[:, 2] > 0]
            assert ann['num_keypoints'] == len(vis) >= 10
            assert (vis[:, :2] >= 0).all() and (vis[:, :2] < 96).all()
            x, y, w, h = ann['bbox']
            assert w > 0 and h > 0 and ann['area'] == pytest.approx(w * h)
            assert (vis[:, 0] >= x).all() and (vis[:, 0] <= x + w).all()
            assert (vis[:, 1] >= y).all() and (vis[:, 1] <= y + h).all()


def test_figure_is_drawn_where_the_keypoints_are(demo_data):
    """Pixels at the annotated joints are the joint dots (white), not background."""
    coco = json.load(open(osp.join(demo_data, 'annotations', 'train.json')))
    hits = total = 0
    for img, ann in zip(coco['images'][:10], coco['annotations'][:10]):
        pixels = cv2.imread(osp.join(demo_data, 'train', img['file_name']))
        for x, y, v in np.array(ann['keypoints']).reshape(17, 3):
            if v > 0:
                total += 1
                hits += int(pixels[int(y), int(x)].min() > 200)
    assert hits / total > 0.9


def test_deterministic_for_a_seed(tmp_path):
    a, b, c = (str(tmp_path / n) for n in 'abc')
    make_demo_dataset(a, num_train=4, num_val=2, size=64, seed=3)
    make_demo_dataset(b, num_train=4, num_val=2, size=64, seed=3)
    make_demo_dataset(c, num_train=4, num_val=2, size=64, seed=4)
    assert _digest(a) == _digest(b) != _digest(c)


@pytest.mark.parametrize('kwargs, word', [(dict(num_train=0), 'num_train'),
                                          (dict(size=16), 'size=16'),
                                          (dict(num_val=2.5), 'num_val')])
def test_bad_arguments_are_named(tmp_path, kwargs, word):
    with pytest.raises(ValueError, match=word):
        make_demo_dataset(str(tmp_path), **kwargs)
