"""A small, learnable COCO-format 17-keypoint dataset of rendered stick figures.

Each image shows one person drawn as limbs between the 17 COCO keypoints, in a random pose,
scale, rotation and position, over a noisy background. Limb colours follow the person's left and
right sides (as in MMPose's skeleton palette), so left/right is learnable. Annotations are exact:
keypoints are the joint positions the figure was drawn from; a keypoint that falls outside the
image is stored as ``(0, 0, 0)`` as COCO does; the bbox is the keypoints' extent plus a margin,
clipped to the image.

Example::

    >>> from mmddp_ext.demo import make_demo_dataset
    >>> paths = make_demo_dataset('data/demo_coco', num_train=320, num_val=80, seed=0)
    >>> sorted(paths)
    ['train', 'val']
"""
import json
import math
import os
import os.path as osp
from typing import Any, Callable, Dict, List, Sequence, Tuple

import cv2
import numpy as np

from mmddp_launch.files import atomic_write_text

from ..utils.checks import is_positive_int

KEYPOINT_NAMES = ('nose', 'left_eye', 'right_eye', 'left_ear', 'right_ear', 'left_shoulder',
                  'right_shoulder', 'left_elbow', 'right_elbow', 'left_wrist', 'right_wrist',
                  'left_hip', 'right_hip', 'left_knee', 'right_knee', 'left_ankle', 'right_ankle')
# COCO skeleton, 0-based keypoint indices.
SKELETON = ((15, 13), (13, 11), (16, 14), (14, 12), (11, 12), (5, 11), (6, 12), (5, 6), (5, 7),
            (6, 8), (7, 9), (8, 10), (1, 2), (0, 1), (0, 2), (1, 3), (2, 4), (3, 5), (4, 6))
_LEFT = {1, 3, 5, 7, 9, 11, 13, 15}
_RIGHT = {2, 4, 6, 8, 10, 12, 14, 16}
_COLORS = {'left': (0, 128, 255), 'right': (255, 128, 0), 'mid': (51, 153, 255)}  # BGR


def _limb_color(a: int, b: int) -> Tuple[int, int, int]:
    if a in _LEFT and b in _LEFT:
        return _COLORS['left']
    if a in _RIGHT and b in _RIGHT:
        return _COLORS['right']
    return _COLORS['mid']


def random_pose(rng: np.random.Generator) -> np.ndarray:
    """Return (17, 2) keypoints of a person of unit height centred near (0, 0).

    A simple kinematic chain: torso, head, two arms and two legs with random joint angles.
    Angles are in radians, measured from "straight down" (image y grows downwards).
    """
    kp = np.zeros((17, 2))
    lean = rng.uniform(-0.25, 0.25)
    down = np.array([math.sin(lean), math.cos(lean)])
    across = np.array([down[1], -down[0]])  # the person's left, seen from the front
    neck, pelvis = -0.28 * down, 0.05 * down
    kp[5], kp[6] = neck + 0.11 * across, neck - 0.11 * across  # shoulders
    kp[11], kp[12] = pelvis + 0.08 * across, pelvis - 0.08 * across  # hips
    head = neck - 0.13 * down + rng.uniform(-0.03, 0.03) * across
    kp[0] = head + 0.02 * down  # nose
    kp[1], kp[2] = head + 0.03 * across - 0.01 * down, head - 0.03 * across - 0.01 * down
    kp[3], kp[4] = head + 0.06 * across + 0.01 * down, head - 0.06 * across + 0.01 * down

    def chain(root: np.ndarray, side: float, lengths: Sequence[float],
              spread: Tuple[float, float]) -> List[np.ndarray]:
        pts, angle = [], lean + side * rng.uniform(*spread)
        p = root
        for length in lengths:
            p = p + length * np.array([math.sin(angle), math.cos(angle)])
            pts.append(p)
            angle += side * rng.uniform(-0.3, 1.2)
        return pts

    kp[7], kp[9] = chain(kp[5], 1.0, (0.16, 0.15), (-0.2, 2.4))  # left arm
    kp[8], kp[10] = chain(kp[6], -1.0, (0.16, 0.15), (-0.2, 2.4))  # right arm
    kp[13], kp[15] = chain(kp[11], 1.0, (0.22, 0.21), (-0.1, 0.7))  # left leg
    kp[14], kp[16] = chain(kp[12], -1.0, (0.22, 0.21), (-0.1, 0.7))  # right leg
    return kp - kp.mean(axis=0)


def render_sample(rng: np.random.Generator, size: int) -> Tuple[np.ndarray, np.ndarray]:
    """Draw one stick figure; return (BGR image, (17, 3) keypoints with visibility)."""
    base = rng.uniform(40, 200, size=3)
    img = np.clip(base + rng.normal(0, 25, size=(size, size, 3)), 0, 255).astype(np.uint8)
    img = cv2.GaussianBlur(img, (3, 3), 0)
    height = rng.uniform(0.45, 0.85) * size
    theta = rng.uniform(-0.5, 0.5)
    rot = np.array([[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]])
    centre = rng.uniform(0.3, 0.7, size=2) * size
    pts = random_pose(rng) @ rot.T * height + centre
    thickness = max(1, int(round(height / 30)))
    for a, b in SKELETON:
        cv2.line(img, tuple(int(v) for v in pts[a]), tuple(int(v) for v in pts[b]),
                 _limb_color(a, b), thickness, cv2.LINE_AA)
    for p in pts:
        cv2.circle(img, (int(p[0]), int(p[1])), thickness, (255, 255, 255), -1, cv2.LINE_AA)
    inside = (pts[:, 0] >= 0) & (pts[:, 0] < size) & (pts[:, 1] >= 0) & (pts[:, 1] < size)
    kpts = np.zeros((17, 3))
    kpts[inside, :2] = pts[inside]
    kpts[inside, 2] = 2
    return img, kpts


def _annotation(ann_id: int, image_id: int, kpts: np.ndarray, size: int) -> Dict:
    vis = kpts[kpts[:, 2] > 0, :2]
    margin = 0.1 * max(np.ptp(vis[:, 0]), np.ptp(vis[:, 1]), 1.0)
    x0, y0 = np.clip(vis.min(axis=0) - margin, 0, size)
    x1, y1 = np.clip(vis.max(axis=0) + margin, 0, size)
    w, h = float(x1 - x0), float(y1 - y0)
    return dict(id=ann_id, image_id=image_id, category_id=1, iscrowd=0,
                bbox=[float(x0), float(y0), w, h], area=w * h,
                keypoints=[round(float(v), 2) for v in kpts.reshape(-1)], num_keypoints=int(
                    (kpts[:, 2] > 0).sum()))


def write_images(out_dir: str, split: str, num_images: int, size: int,
                 render: Callable[[], Tuple[np.ndarray, Any]]) -> Tuple[List[Dict], List[Any]]:
    """Write ``num_images`` images drawn by ``render()`` to ``<out_dir>/<split>/000000.png``, ...
    (and create ``<out_dir>/annotations``), in order, for both demo datasets.

    Returns:
        The COCO ``images`` records (ids from 1) and, per image, what ``render`` returned
        besides the image (keypoints, objects), for the caller's annotations.
    """
    os.makedirs(osp.join(out_dir, split), exist_ok=True)
    os.makedirs(osp.join(out_dir, 'annotations'), exist_ok=True)
    images, drawn = [], []
    for i in range(num_images):
        img, what = render()
        name = f'{i:06d}.png'
        cv2.imwrite(osp.join(out_dir, split, name), img)
        images.append(dict(id=i + 1, file_name=name, width=size, height=size))
        drawn.append(what)
    return images, drawn


def make_split(out_dir: str, split: str, num_images: int, size: int, seed: int) -> str:
    """Write ``<out_dir>/<split>/*.png`` and ``<out_dir>/annotations/<split>.json``."""
    rng = np.random.default_rng(seed)
    images, figures = write_images(out_dir, split, num_images, size,
                                   lambda: render_sample(rng, size))
    annotations = [_annotation(i + 1, i + 1, kpts, size) for i, kpts in enumerate(figures)]
    coco = dict(
        info=dict(description=f'mmddp_ext demo stick figures ({split}, seed {seed})'),
        images=images, annotations=annotations, categories=[
            dict(id=1, name='person', supercategory='person', keypoints=list(KEYPOINT_NAMES),
                 skeleton=[[a + 1, b + 1] for a, b in SKELETON])
        ])
    return write_annotations(out_dir, split, coco)


def write_annotations(out_dir: str, split: str, coco: Dict) -> str:
    """Write ``<out_dir>/annotations/<split>.json`` atomically; returns its path."""
    ann_file = osp.join(out_dir, 'annotations', f'{split}.json')
    atomic_write_text(ann_file, json.dumps(coco))  # never a half-written annotation file
    return ann_file


def check_sizes(num_train: int, num_val: int, size: int, what: str) -> None:
    """ValueError naming the argument unless counts and size are positive ints, size >= 32."""
    for name, value in (('num_train', num_train), ('num_val', num_val), ('size', size)):
        if not is_positive_int(value):
            raise ValueError(f'{name} must be a positive integer, got {value!r}')
    if size < 32:
        raise ValueError(f'size={size} is too small to draw {what}; use 32 or more')


def make_demo_dataset(out_dir: str, num_train: int = 320, num_val: int = 80, size: int = 128,
                      seed: int = 0) -> Dict[str, str]:
    """Write the train and val splits; return ``{split: annotation file}``.

    Deterministic for a given ``seed`` (train uses ``seed``, val ``seed + 1``).
    """
    check_sizes(num_train, num_val, size, 'a figure')
    return {
        'train': make_split(out_dir, 'train', num_train, size, seed),
        'val': make_split(out_dir, 'val', num_val, size, seed + 1)
    }
