"""How a global batch splits over devices and gradient accumulation (pure standard library).

:func:`best_split` picks the split with the least accumulation under a per-device cap; the
other two word what goes wrong: a global batch the devices cannot share evenly (an error with
the nearest sizes that work) and a split that runs many small micro-batches (a warning with the
nearest global sizes that fill the cap better).
"""
import itertools
from typing import List, Optional, Tuple


def best_split(global_batch: int, world_size: int, cap: int) -> Optional[Tuple[int, int]]:
    """``(per_device, accumulation)`` with the smallest accumulation, or None if the global
    batch is not divisible by ``world_size``."""
    if global_batch % world_size:
        return None
    per_rank = global_batch // world_size
    per_device = next(d for d in range(min(cap, per_rank), 0, -1) if per_rank % d == 0)
    return per_device, per_rank // per_device


def not_divisible(global_batch: int, world_size: int, source: str) -> ValueError:
    """The error for a global batch that ``world_size`` devices cannot share evenly."""
    below = global_batch // world_size * world_size
    above = below + world_size
    if below == 0:
        options, nearest = f'{above}', above
    else:
        options = f'{below} or {above}'
        nearest = below if global_batch - below <= above - global_batch else above
    what = (f'{source}={global_batch}' if source == 'scaling.global_batch_size' else
            f'the global batch {global_batch} (from {source})')
    return ValueError(f'{what} is not divisible by world_size {world_size}: use {options} '
                      f'(--cfg-options scaling.global_batch_size={nearest})')


def small_batch_warning(global_batch: int, world_size: int, cap: int, split: Tuple[int, int],
                        warnings: List[str]) -> None:
    """Warn when accumulation forces a per-device batch under half the cap."""
    per_device, accumulation = split
    if accumulation == 1 or 2 * per_device >= cap:
        return

    def good(g: int) -> bool:
        return g % world_size == 0 and 2 * best_split(g, world_size, cap)[0] >= cap

    below = next((g for g in range(global_batch - world_size, 0, -world_size) if good(g)), None)
    above = next(g for g in itertools.count(global_batch + world_size, world_size) if good(g))
    options = [g for g in (below, above) if g is not None]
    nearest = min(options, key=lambda g: (abs(g - global_batch), g))
    splits = [(g, best_split(g, world_size, cap)) for g in options]
    described = ' or '.join(f'{g} (per-device {s[0]} × accumulation {s[1]})' for g, s in splits)
    warnings.append(
        f'per-device batch {per_device} × accumulation {accumulation} (global {global_batch} '
        f'on {world_size} devices) is under half the cap {cap}, so each optimizer step runs '
        f'{accumulation} small micro-batches: a global size such as {described} fits the cap '
        f'better (--cfg-options scaling.global_batch_size={nearest})')
