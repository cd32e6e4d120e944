"""A small, learnable COCO-format detection dataset of coloured shapes, for the MMDetection
example config (docs/launching.md, 'Entry points you already have') and the tests.

:func:`make_demo_det_dataset` writes it (what an image shows, the annotations and the file
layout: its docstring); ``python tools/make_demo_data.py --task det`` calls it.
"""
from typing import Dict, List, Tuple

import cv2
import numpy as np

from .pose import check_sizes, write_annotations, write_images

CLASSES = ('square', 'circle', 'triangle')
# Per class, the (low, high) range of each BGR channel of the fill colour.
_COLOUR_FAMILIES = {
    'square': ((0, 70), (0, 70), (170, 256)),  # red
    'circle': ((0, 70), (160, 256), (0, 70)),  # green
    'triangle': ((170, 256), (0, 90), (0, 70)),  # blue
}
_MAX_OBJECTS = 4
_PLACEMENT_TRIES = 30


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    """A greyish, slightly tinted, smoothly noisy BGR background."""
    base = rng.uniform(50, 190) + rng.uniform(-15, 15, size=3)
    img = np.clip(base + rng.normal(0, 18, size=(size, size, 3)), 0, 255).astype(np.uint8)
    return cv2.GaussianBlur(img, (3, 3), 0)


def _shape_mask(name: str, x0: int, y0: int, w: int, h: int, size: int,
                rng: np.random.Generator) -> np.ndarray:
    """A ``(size, size)`` uint8 mask with one filled shape inside the box (x0, y0, w, h)."""
    mask = np.zeros((size, size), np.uint8)
    if name == 'square':
        mask[y0:y0 + h, x0:x0 + w] = 1
    elif name == 'circle':
        r = (w - 1) // 2
        cv2.circle(mask, (x0 + r, y0 + r), r, 1, -1, lineType=cv2.LINE_8)
    else:  # an isosceles triangle pointing up, down, left or right
        x1, y1, xm, ym = x0 + w - 1, y0 + h - 1, x0 + (w - 1) / 2, y0 + (h - 1) / 2
        pts = [((xm, y0), (x0, y1), (x1, y1)), ((xm, y1), (x0, y0), (x1, y0)),
               ((x0, ym), (x1, y0), (x1, y1)), ((x1, ym), (x0, y0), (x0, y1))][rng.integers(4)]
        cv2.fillPoly(mask, [np.round(np.array(pts)).astype(np.int32)], 1, cv2.LINE_8)
    return mask


def _overlaps(box: Tuple[int, int, int, int], others: List[Tuple[int, int, int, int]],
              gap: int = 2) -> bool:
    x, y, w, h = box
    return any(x < ox + ow + gap and ox < x + w + gap and y < oy + oh + gap and oy < y + h + gap
               for ox, oy, ow, oh in others)


def render_sample(rng: np.random.Generator, size: int) -> Tuple[np.ndarray, List[Dict]]:
    """Draw one image.

    Args:
        rng: The random generator to draw from.
        size: Image width and height in pixels.

    Returns:
        The BGR image and its objects, each ``dict(category_id, bbox=[x, y, w, h], area)``.
    """
    img = _background(rng, size)
    placed: List[Tuple[int, int, int, int]] = []
    objects = []
    for _ in range(int(rng.integers(1, _MAX_OBJECTS + 1))):
        label = int(rng.integers(len(CLASSES)))
        name = CLASSES[label]
        for _ in range(_PLACEMENT_TRIES):
            w = int(rng.integers(round(0.15 * size), round(0.4 * size) + 1))
            h = int(round(w * rng.uniform(0.75, 1.0))) if name == 'triangle' else w
            box = (int(rng.integers(0, size - w + 1)), int(rng.integers(0, size - h + 1)), w, h)
            if not _overlaps(box, placed):
                break
        else:
            continue  # no free spot: fewer objects in this image
        placed.append(box)
        mask = _shape_mask(name, *box, size, rng).astype(bool)
        colour = np.array([rng.integers(lo, hi) for lo, hi in _COLOUR_FAMILIES[name]])
        noise = rng.normal(0, 6, size=(int(mask.sum()), 3))
        img[mask] = np.clip(colour + noise, 0, 255).astype(np.uint8)
        ys, xs = np.nonzero(mask)
        x, y = int(xs.min()), int(ys.min())
        objects.append(
            dict(category_id=label + 1, area=float(mask.sum()),
                 bbox=[float(x),
                       float(y),
                       float(xs.max() - x + 1),
                       float(ys.max() - y + 1)]))
    return img, objects


def make_split(out_dir: str, split: str, num_images: int, size: int,
               rng: np.random.Generator) -> str:
    """Write ``<out_dir>/<split>/*.png`` and ``<out_dir>/annotations/<split>.json``.

    Args:
        out_dir: The dataset root.
        split: The split name, e.g. ``'train'``.
        num_images: How many images to write.
        size: Image width and height in pixels.
        rng: The random generator to draw from.

    Returns:
        The path of the annotation file.
    """
    images, drawn = write_images(out_dir, split, num_images, size, lambda: render_sample(rng, size))
    annotations = []
    for i, objects in enumerate(drawn):
        for obj in objects:
            annotations.append(dict(id=len(annotations) + 1, image_id=i + 1, iscrowd=0, **obj))
    coco = dict(
        info=dict(description=f'mmddp_ext demo coloured shapes ({split})'), images=images,
        annotations=annotations,
        categories=[dict(id=k + 1, name=n, supercategory='shape') for k, n in enumerate(CLASSES)])
    return write_annotations(out_dir, split, coco)


def make_demo_det_dataset(out_dir: str, num_train: int = 200, num_val: int = 50, size: int = 128,
                          seed: int = 0) -> Dict[str, str]:
    """Write the train and val splits of the coloured-shapes dataset.

    Each image shows 1 to 4 filled shapes, one of :data:`CLASSES` each ('square', 'circle',
    'triangle'), at random positions and sizes over a noisy, low-saturation background. Every
    class has its own colour family (squares reddish, circles greenish, triangles bluish; the
    exact shade varies per object), so a small detector learns it in minutes on a CPU. Shapes
    never overlap and lie wholly inside the image, and annotations are exact: each bbox
    ``[x, y, w, h]`` is the extent of the shape's drawn pixels (pixel-edge convention, as
    COCO's), ``area`` is its pixel count, ``iscrowd`` is 0 and the categories have ids 1..3 in
    :data:`CLASSES` order.

    Layout (what MMDetection's ``CocoDataset`` reads with ``data_prefix=dict(img='<split>/')``)::

        <out_dir>/train/000000.png ...        <out_dir>/annotations/train.json
        <out_dir>/val/000000.png ...          <out_dir>/annotations/val.json

    Deterministic for a given ``seed``: the same arguments write identical files. The two splits
    draw from independent streams of ``numpy.random.default_rng(seed)``, so the val images do
    not depend on ``num_train``.

    Args:
        out_dir: The dataset root; created if missing, files in it overwritten.
        num_train: Number of training images.
        num_val: Number of validation images.
        size: Image width and height in pixels (32 or more).
        seed: A non-negative integer seed.

    Returns:
        ``{split: annotation file}`` for ``'train'`` and ``'val'``.

    Raises:
        ValueError: naming the argument and its value, when one is not valid.

    Example::

        >>> from mmddp_ext.demo import make_demo_det_dataset
        >>> paths = make_demo_det_dataset('data/demo_det', num_train=200, num_val=50, seed=0)
        >>> sorted(paths)
        ['train', 'val']
    """
    check_sizes(num_train, num_val, size, 'shapes')
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f'seed must be a non-negative integer, got {seed!r}')
    train_rng, val_rng = np.random.default_rng(seed).spawn(2)
    return {
        'train': make_split(out_dir, 'train', num_train, size, train_rng),
        'val': make_split(out_dir, 'val', num_val, size, val_rng)
    }
