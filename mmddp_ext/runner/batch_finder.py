"""The batch finder: the largest per-device batch that fits on every rank
(``max_batch_per_device='auto'``), measured by :func:`find_max_batch` before the Runner is
built, on a model of its own, and stored for the next run (:func:`cache_location`,
:meth:`StoredResult.correct`).

How it measures (the warm-up step, trials with a reserve held, the ranks' agreement after
each, the stored result) and how training checks and guards its answer: docs/scaling.md,
"Finding the per-device batch that fits". The trial step is :mod:`mmddp_ext.runner.trials`.
"""
import hashlib
import json
import os.path as osp
from dataclasses import dataclass
from typing import Any, List, Mapping, NamedTuple, Optional, Tuple

import torch
from mmengine.dist import broadcast_object_list, get_rank
from mmengine.registry import init_default_scope

from ..errors import NothingFitsError
from ..gpu import gpus
from ..memory.budget import MARGIN, Budget, held_bytes
from ..scaling.search import SearchResult, Trial, max_trials, search_max_batch
from ..utils.io import atomic_write_text
from ..utils.log import log_line
from ..utils.units import format_mib
from .trials import Trials

CACHE_FILE = 'batch_probe.json'  # in the work dir: the measured batch, reused by a restart
# On a CPU the budget also holds what the Runner builds beside the model (dataloader and its
# worker queues' threads, datasets, evaluator, hooks, logger, visualizer): measured 145 MiB
# more than the trials after their warm-up, for the 128x128 demo with its 2 workers, at
# per-device batch 8 and 32 alike (docs/scaling.md), so the reserve held free during a trial
# is at least this much there.
CPU_RESERVE_MIB = 160


@dataclass(frozen=True)
class TrialBaseline:
    """What this rank held between the finder's trials, to compare training with.

    Attributes:
        device: The rank's device, e.g. ``'cpu'`` or ``'cuda:0'``.
        held_bytes: :func:`~mmddp_ext.memory.budget.held_bytes` after the warm-up step, with
            the trials' model, gradients and optimizer state in place.
        reserve_bytes: What was kept free during each trial for what training adds.
        max_batch: The per-device batch the finder found.
    """

    device: str
    held_bytes: int
    reserve_bytes: int
    max_batch: int


def cache_key(facts: Mapping[str, Any]) -> str:
    """A stable digest of what a measured batch depends on (model, pipeline, optimizer,
    device, budget, margin, world size, ...), so a restarted run reuses the result and a
    changed one measures again. Values must be JSON-serialisable (others are turned into
    strings)."""
    text = json.dumps(facts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def reserve_bytes(budget: Budget) -> int:
    """Bytes kept free during each trial: MARGIN of the budget, at least CPU_RESERVE_MIB on a
    CPU."""
    reserve = int(MARGIN * budget.nbytes)
    return max(reserve, CPU_RESERVE_MIB * 2**20) if budget.device == 'cpu' else reserve


def _cache_facts(cfg: Any, world_size: int, upper: int, device: torch.device,
                 budget_mib: Optional[int]) -> dict:
    hardware = 'cpu'
    if device.type == 'cuda':
        g = gpus()
        hardware = f'{g.name(device.index)} {g.mem_get_info(device.index)[1]}'
    return dict(model=cfg.model, dataset=cfg.train_dataloader.get('dataset'),
                collate=cfg.train_dataloader.get('collate_fn'), optim=cfg.optim_wrapper,
                wrapper=cfg.get('model_wrapper_cfg'), world_size=world_size, upper=upper,
                hardware=hardware, budget_mib=budget_mib, margin=MARGIN,
                cpu_reserve_mib=CPU_RESERVE_MIB, torch=torch.__version__)


def _read_cache(path: str, key: str) -> Optional[SearchResult]:
    """Rank 0 reads ``path``; every rank gets the same answer."""
    found: List[Optional[dict]] = [None]
    if get_rank() == 0 and osp.isfile(path):
        try:
            with open(path) as f:
                stored = json.load(f)
            found[0] = stored['result'] if stored.get('key') == key else None
        except (OSError, ValueError, KeyError, TypeError):
            found[0] = None  # unreadable: measure again
    broadcast_object_list(found)
    return SearchResult.from_dict(found[0]) if found[0] else None


def _write_cache(path: str, key: str, result: SearchResult, how: str) -> None:
    if get_rank() != 0:
        return
    atomic_write_text(
        path,
        json.dumps(dict(key=key, measured=how, margin=MARGIN, result=result.to_dict()), indent=1))


class StoredResult(NamedTuple):
    """Where the finder's result for a run is stored (``path``: None without a work dir) and
    the ``key`` of what it depends on. The runner hands it to the hooks as
    ``runner.batch_probe``."""

    path: Optional[str]
    key: str

    def correct(self, max_batch: int, why: str) -> None:
        """Store a smaller ``max_batch`` after training ran out of memory at the one the
        finder picked, so that the next run plans with it. Rank 0 writes; a no-op elsewhere or
        when no result was stored."""
        if not self.path or get_rank() != 0 or not osp.isfile(self.path):
            return
        try:
            with open(self.path) as f:
                stored = json.load(f)
        except (OSError, ValueError):
            return
        if stored.get('key') != self.key or stored['result']['max_batch'] <= max_batch:
            return
        stored.setdefault('corrections', []).append(
            dict(found=stored['result']['max_batch'], now=max_batch, why=why))
        stored['result']['max_batch'] = max_batch
        atomic_write_text(self.path, json.dumps(stored, indent=1))


def cache_location(cfg: Any, world_size: int, upper: int, device: torch.device,
                   budget_mib: Optional[int]) -> StoredResult:
    """Where the finder's result for this run is stored, and its key."""
    work_dir = cfg.get('work_dir')
    path = osp.join(work_dir, CACHE_FILE) if work_dir else None
    return StoredResult(path, cache_key(_cache_facts(cfg, world_size, upper, device, budget_mib)))


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
    result = _read_cache(path, key) if path else None
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
        _write_cache(path, key, result, budget.how)
    return result, TrialBaseline(str(device), held, reserve, result.max_batch), stored


def _nothing_fits(failed: List[int], budget: Budget, reserve: int, what: str) -> str:
    return (f'not even a per-device batch of 1 fits on rank(s) {failed} ({what} ran out of '
            f'memory; measured on rank {get_rank()}: {budget.how}; {format_mib(reserve)} kept '
            f'free during each trial): raise scaling.memory_budget_mib, free memory on those '
            f'ranks, use a smaller input size or model, or train on a device with more memory')
