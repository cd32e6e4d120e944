"""Test-only: makes a few images of the generated detection dataset (``mmddp_ext.demo.det``)
much heavier, in place: each becomes its own picture tiled ``tiles`` × ``tiles`` (``tiles``
times the side, ``tiles``² times the objects), its annotations copied to every tile."""
import json
import os.path as osp
from typing import Iterable

import cv2
import numpy as np


def make_heavier(data_root: str, image_ids: Iterable[int], tiles: int = 4,
                 split: str = 'train') -> None:
    ann_file = osp.join(data_root, 'annotations', f'{split}.json')
    with open(ann_file) as f:
        coco = json.load(f)
    images = {im['id']: im for im in coco['images']}
    annotations = []
    for ann in coco['annotations']:
        if ann['image_id'] not in image_ids:
            annotations.append(ann)
    for image_id in image_ids:
        image = images[image_id]
        path = osp.join(data_root, split, image['file_name'])
        pixels = cv2.imread(path)
        cv2.imwrite(path, np.tile(pixels, (tiles, tiles, 1)))
        width, height = image['width'], image['height']
        image.update(width=width * tiles, height=height * tiles)
        for ann in [a for a in coco['annotations'] if a['image_id'] == image_id]:
            for row in range(tiles):
                for col in range(tiles):
                    x, y, w, h = ann['bbox']
                    annotations.append(
                        dict(ann, id=0, bbox=[x + col * width, y + row * height, w, h]))
    for k, ann in enumerate(annotations):
        ann['id'] = k + 1
    coco['annotations'] = annotations
    with open(ann_file, 'w') as f:
        json.dump(coco, f)
