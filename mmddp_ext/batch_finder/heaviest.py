"""Which samples make the heaviest batch of a rank's share (pure: sizes in, indices out).

A training step's memory grows with the image shape after the pipeline (a keep-ratio resize,
then the batch padded to its largest image, rounded up to ``pad_size_divisor``) and with the
number of objects (the assigner's IoU matrix is objects × anchors). Where the dataset knows
each image's height, width and objects without running the pipeline (MMEngine's
``get_data_info``), the finder and the forecast measure the samples that make the largest
padded batch, most objects first among equals, instead of the first ones of the share.
Top-down pose crops every sample to one input size: nothing to rank there.
"""
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

# transforms whose output has one size whatever the image (MMPose's top-down crop)
FIXED_SIZE = ('TopdownAffine', )
RESIZES = ('Resize', 'RandomResize', 'RandomChoiceResize', 'FixShapeResize')


@dataclass(frozen=True)
class ResizeRule:
    """The largest output a pipeline's resize can give: ``scale`` as (width, height), and
    whether it keeps the aspect ratio (then the image fits inside ``scale``)."""

    scale: Tuple[int, int]
    keep_ratio: bool


@dataclass(frozen=True)
class SampleSize:
    """What the dataset says of one sample before the pipeline runs."""

    index: int
    height: int
    width: int
    objects: int


def _pair(scale: Any) -> Tuple[int, int]:
    if isinstance(scale, (int, float)):
        return int(scale), int(scale)
    return int(scale[0]), int(scale[1])


def resize_rule(pipeline: Sequence[Mapping]) -> Optional[ResizeRule]:
    """The last resize of ``pipeline`` at its largest (``RandomResize``'s upper ratio or
    scale, ``RandomChoiceResize``'s largest choice); None where it has none."""
    rule = None
    for t in pipeline or ():
        kind = str(t.get('type', '')).split('.')[-1]
        if kind not in RESIZES:
            continue
        keep = bool(t.get('keep_ratio', kind != 'FixShapeResize'))
        if kind == 'RandomChoiceResize':
            scales = [_pair(s) for s in t.get('scales', ())]
        elif kind == 'FixShapeResize':
            scales = [(int(t.get('width')), int(t.get('height')))]
        else:
            scale = t.get('scale')
            if scale is None:
                continue
            several = isinstance(scale, (list, tuple)) and isinstance(scale[0], (list, tuple))
            scales = [_pair(s) for s in scale] if several else [_pair(scale)]
            if kind == 'RandomResize' and t.get('ratio_range'):
                top = max(t['ratio_range'])
                scales = [(int(w * top), int(h * top)) for w, h in scales]
        if scales:
            rule = ResizeRule((max(w for w, _ in scales), max(h for _, h in scales)), keep)
    return rule


def fixed_size(pipeline: Sequence[Mapping]) -> bool:
    """Whether the pipeline crops every sample to one size (top-down pose)."""
    return any(str(t.get('type', '')).split('.')[-1] in FIXED_SIZE for t in pipeline or ())


def resized(height: int, width: int, rule: Optional[ResizeRule]) -> Tuple[int, int]:
    """``(height, width)`` after ``rule``, as mmcv rescales: keeping the ratio, the image fits
    inside the scale (long edge against the long side, short against the short)."""
    if rule is None:
        return height, width
    w, h = rule.scale
    if not rule.keep_ratio:
        return h, w
    factor = min(max(w, h) / max(height, width), min(w, h) / min(height, width))
    return int(height * factor + 0.5), int(width * factor + 0.5)


def padded(height: int, width: int, divisor: int) -> Tuple[int, int]:
    """``(height, width)`` rounded up to ``divisor`` (the data preprocessor's padding)."""
    d = max(1, int(divisor or 1))
    return math.ceil(height / d) * d, math.ceil(width / d) * d


def size_of(index: int, info: Mapping) -> Optional[SampleSize]:
    """A sample's height, width and objects from its data info (MMDetection's ``height``,
    ``width`` and ``instances``; MMPose's bottom-up ``img_shape`` and ``bbox``), or None."""
    height, width = info.get('height'), info.get('width')
    if (height is None or width is None) and info.get('img_shape') is not None:
        height, width = info['img_shape'][:2]
    if not height or not width:
        return None
    if info.get('instances') is not None:
        objects = len(info['instances'])
    else:
        bbox = info.get('bbox')
        objects = len(bbox) if getattr(bbox, 'ndim', 0) == 2 else (1 if bbox is not None else 0)
    return SampleSize(index, int(height), int(width), objects)


@dataclass(frozen=True)
class Heaviest:
    """The samples chosen and why, for the log.

    Attributes:
        indices: dataset indices, heaviest first (``count`` of them, the share repeated when
            it is smaller).
        shape: the batch's padded ``(height, width)``.
        objects: the most objects one of them holds.
        note: one line naming them.
    """

    indices: List[int]
    shape: Tuple[int, int]
    objects: int
    note: str


def _batch(order: List[int], weights: Dict[int, Tuple[int, int, Tuple[int, int]]],
           count: int) -> Tuple[Tuple[int, int], List[int], Tuple[int, int], int]:
    """The ``count`` first of ``order`` (repeated where fewer): their batch's weight (padded
    area, most objects), indices, padded shape and most objects."""
    chosen = [order[k % len(order)] for k in range(count)]
    shape = (max(weights[i][2][0] for i in chosen), max(weights[i][2][1] for i in chosen))
    objects = max(weights[i][1] for i in chosen)
    return (shape[0] * shape[1], objects), chosen, shape, objects


def heaviest(sizes: Sequence[SampleSize], count: int, rule: Optional[ResizeRule], divisor: int,
             whose: str, by_aspect: bool = False) -> Optional[Heaviest]:
    """The ``count`` samples of ``sizes`` (one rank's share) that make its heaviest batch:
    largest padded area after ``rule``, then most objects; a batch is padded to its tallest
    and its widest image. ``by_aspect``: batches hold one orientation only (MMDetection's
    ``AspectRatioBatchSampler``: width < height, or not), so the heavier orientation's. None
    where all weigh the same (one size and one object count: any batch is every batch)."""
    if not sizes:
        return None
    weights: Dict[int, Tuple[int, int, Tuple[int, int]]] = {}
    for s in sizes:
        shape = padded(*resized(s.height, s.width, rule), divisor)
        weights[s.index] = (shape[0] * shape[1], s.objects, shape)
    if len({w[:2] for w in weights.values()}) == 1:
        return None
    order = sorted(weights, key=lambda i: weights[i][:2], reverse=True)
    groups = [order]
    if by_aspect:
        tall = {s.index for s in sizes if s.width < s.height}
        groups = [
            g for g in ([i for i in order if i in tall], [i for i in order if i not in tall]) if g
        ]
    _, chosen, shape, objects = max((_batch(g, weights, count) for g in groups), key=lambda b: b[0])
    shown = ', '.join(str(i) for i in chosen[:5]) + (', …' if len(chosen) > 5 else '')
    note = (f'the heaviest of {whose} ({len(sizes)} samples): {shape[1]}×{shape[0]} padded, '
            f'{objects} objects (samples {shown})')
    return Heaviest(chosen, shape, objects, note)
