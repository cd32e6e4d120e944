"""The batch finder: the largest per-device batch that fits on every rank
(``max_batch_per_device='auto'``), measured by :func:`find_max_batch` before the Runner is
built, on a model of its own, and stored for the next run (:mod:`.cache`).

How it measures (the warm-up step, trials with a reserve held, the ranks' agreement after
each, the stored result) and how training checks and guards its answer: docs/scaling.md,
"Finding the per-device batch that fits". The trial step is :mod:`mmddp_ext.batch_finder.trials`.
"""
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import torch
from mmengine.dist import get_rank
from mmengine.registry import init_default_scope

from ..errors import NothingFitsError
from ..memory.budget import Budget, held_bytes
from ..utils.log import log_line
from ..utils.units import format_mib
from .cache import StoredResult, cache_location, read_cache, write_cache
from .search import SearchResult, Trial, max_trials, search_max_batch
from .trials import Trials, reserve_bytes


@dataclass(frozen=True)
class TrialBaseline:
    """What this rank held between the finder's trials, to compare training with.

    Attributes:
        device: The rank's device, e.g. ``'cpu'`` or ``'cuda:0'``.
        held_bytes: :func:`~mmddp_ext.memory.budget.held_bytes` after the warm-up step, with
            the trials' model, gradients and optimizer state in place.
        reserve_bytes: What was kept free during each trial for what training adds.
        max_batch: The per-device batch the finder found.
        samples: Which samples its trials ran on, and why.
    """

    device: str
    held_bytes: int
    reserve_bytes: int
    max_batch: int
    samples: str = ''


def find_max_batch(
        cfg: Any, world_size: int, upper: int, budget: Budget, budget_mib: Optional[int],
        device: torch.device) -> Tuple[SearchResult, Optional[TrialBaseline], StoredResult]:
    """The largest per-device batch in ``1..upper`` that fits on every rank, what this rank
    held between the trials (None when the result was read from the work dir), and where the
    result is stored. All ranks must call this.

    Args:
        cfg: The config (model, optimizer, train dataloader, wrapper, work_dir).
        world_size: Number of ranks (part of the cache key).
        upper: The largest batch worth trying: samples per device per optimizer step.
        budget: What is measured (from :func:`mmddp_ext.memory.budget.apply_budget`).
        budget_mib: ``scaling.memory_budget_mib`` (part of the cache key).
        device: This rank's device.

    Raises:
        NothingFitsError: when not even one sample per device fits (it names the ranks).
    """
    init_default_scope(cfg.get('default_scope', 'mmengine'))
    stored = cache_location(cfg, world_size, upper, device, budget_mib)
    path, key = stored
    result = read_cache(path, key) if path else None
    if result is not None:
        log_line(
            'batch probe: '
            f'per-device batch {result.max_batch} fits on every rank (measured before, read '
            f'from {path}; delete it to measure again)', rank0_only=True)
        return result, None, stored
    reserve = reserve_bytes(budget)
    log_line(
        'batch probe: '
        f'measuring {budget.how}; {format_mib(reserve, unit="")} of {format_mib(budget.nbytes)} '
        f'are kept free during each trial; a warm-up step, then at most {max_trials(upper)} '
        f'trials of forward + backward + optimizer step, per-device batch up to {upper}',
        rank0_only=True)
    trials = Trials(cfg, device, upper, reserve)
    log_line(f'batch probe: trial samples: {trials.sample_note}')  # each rank its own share

    def progress(number: int, trial: Trial) -> None:
        verdict = ('fits on every rank'
                   if trial.fits else f'out of memory on rank(s) {trials.failed}')
        log_line(
            'batch probe: '
            f'trial {number}: per-device batch {trial.batch}: {verdict} ({trial.seconds:.1f} s)',
            rank0_only=True)

    try:
        if not trials.fits(1):
            raise NothingFitsError(
                _nothing_fits(trials.failed, budget, reserve, 'the warm-up step'), trials.failed)
        held = held_bytes(device)
        log_line(
            'batch probe: '
            f'warm-up at per-device batch 1 fits on every rank (the optimizer state and the '
            f'kernels of a first step are now allocated, as in training); every trial starts '
            f'from {format_mib(held)} held on rank {get_rank()}', rank0_only=True)
        result = search_max_batch(upper, trials.fits, progress)
    finally:
        trials.close()
    if result.max_batch == 0:
        raise NothingFitsError(
            _nothing_fits(trials.failed, budget, reserve, 'a trial'), trials.failed)
    log_line(
        'batch probe: '
        f'per-device batch {result.max_batch} fits on every rank ({len(result.trials)} trials, '
        f'{result.seconds:.1f} s)', rank0_only=True)
    if path:
        write_cache(path, key, result, budget.how)
    return result, TrialBaseline(str(device), held, reserve, result.max_batch,
                                 trials.sample_note), stored


def _nothing_fits(failed: List[int], budget: Budget, reserve: int, what: str) -> str:
    return (f'not even a per-device batch of 1 fits on rank(s) {failed} ({what} ran out of '
            f'memory; measured on rank {get_rank()}: {budget.how}; {format_mib(reserve)} kept '
            f'free during each trial): raise scaling.memory_budget_mib, free memory on those '
            f'ranks, use a smaller input size or model, or train on a device with more memory')
