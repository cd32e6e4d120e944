"""Validation and test metrics that do not change with the number of ranks.

MMEngine's ``DefaultSampler`` gives rank ``r`` every ``world_size``-th sample from ``r`` and
pads the dataset to a multiple of the world size with its first samples; the evaluator's
result collection (``mmengine.dist.collect_results``) interleaves the ranks' results in that
order and cuts them at the dataset's length, so the padded copies are dropped and every sample
counts once: the same metrics on 1, 2 or 3 ranks (``tests/e2e/test_evaluation_ranks.py``).
torch's ``DistributedSampler`` lays samples out the same way. Another sampler, on a dataset
whose length the world size does not divide, may lay them out otherwise: then a padded sample
can count twice and another not at all. :class:`WarnsOfEvaluationPadding` says so once per loop,
before it runs, naming the sampler and the fix.
"""
import logging
from typing import Any, Optional

from ..utils.log import log_line

ORDER_KEEPING = ('DefaultSampler', 'DistributedSampler')  # their rank layout is collect's


def padding_warning(split: str, sampler: str, samples: int, world_size: int) -> Optional[str]:
    """The warning for ``split``'s sampler (its class name) on ``samples`` samples and
    ``world_size`` ranks, or None when every sample counts once."""
    if world_size < 2 or samples % world_size == 0 or sampler in ORDER_KEEPING:
        return None
    padded = -(-samples // world_size) * world_size
    return (f'{split}_dataloader.sampler is {sampler}: with {world_size} ranks its {samples} '
            f'samples become {padded}, and MMEngine drops the extra ones only in '
            f"DefaultSampler's order, so a sample may count twice in the metrics and another "
            f'not at all: use {split}_dataloader.sampler=dict(type=\'DefaultSampler\', '
            'shuffle=False), or a set whose size the number of ranks divides')


class WarnsOfEvaluationPadding:
    """Mixin for a ``Runner``: the val and test loops it builds are checked by
    :func:`padding_warning`."""

    def build_val_loop(self, loop: Any) -> Any:
        built = super().build_val_loop(loop)
        _check(built, 'val', self.world_size)
        return built

    def build_test_loop(self, loop: Any) -> Any:
        built = super().build_test_loop(loop)
        _check(built, 'test', self.world_size)
        return built


def _check(loop: Any, split: str, world_size: int) -> None:
    loader = getattr(loop, 'dataloader', None)
    dataset = getattr(loader, 'dataset', None)
    try:
        samples = len(dataset)
    except TypeError:  # no length: nothing to pad
        return
    warning = padding_warning(split,
                              type(getattr(loader, 'sampler', None)).__name__, samples, world_size)
    if warning:
        log_line(warning, logging.WARNING, rank0_only=True)
