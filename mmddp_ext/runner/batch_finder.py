"""Measure the largest per-device batch that fits on every rank (``max_batch_per_device='auto'``).

:func:`find_max_batch` runs before the Runner is built, on a model of its own:

1. the model from ``cfg.model`` on this rank's device, wrapped like the Runner will wrap it
   (DDP's gradient buckets, or ``MicrobatchDDP``'s flat gradients, are allocated when the
   wrapper is built, so they are in the measurement), the
   optimizer from ``cfg.optim_wrapper``, and real samples from ``cfg.train_dataloader`` (this
   rank's part of the sampler's order, through the training pipeline);
2. every trial is forward + backward + optimizer step on a batch of those samples, run on the
   inner model so that no collective runs inside it (an out-of-memory error on one rank would
   leave the ranks' collectives out of step); a reserve (:func:`reserve_bytes`) is held
   during the trial, so what fits leaves that much free for what training adds. With DDP
   the trial's gradients are a copy beside the buckets, which errs on the safe side;
3. after each trial the ranks agree (MIN over ranks of "it fitted"), so every rank follows the
   same search (:func:`mmddp_ext.scaling.search.search_max_batch`);
4. the model is dropped before the Runner builds its own, and the result is stored in
   ``<work_dir>/batch_probe.json``: a restart with the same model, pipeline, optimizer, device,
   budget and world size reads it instead of probing again.

A trial cannot hold everything training will (the Runner's hooks, the dataloader, a kernel
that needs a workspace only in a later iteration), so the answer is guarded: with ``'auto'``
the model wrapper is :class:`~mmddp_ext.dist.microbatch.MicrobatchDDP` unless
``scaling.on_oom`` says otherwise. If a training step then runs out of memory on any rank,
every rank agrees and redoes it as micro-batches (global batch and LR unchanged), the log says
which batch is now in use, and :func:`correct_cache` stores it, so the next run plans with it.

One trial, two users: :meth:`Trials.run` is the step of the finder (:meth:`Trials.fits`,
agreed by all ranks) and of the memory forecast (:func:`measure_steps`: one process, peaks
read per step, for ``dist_train.py --explain --memory``).
"""
import copy
import itertools
import json
import os
import os.path as osp
import time
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import torch
from mmengine.dist import broadcast_object_list, get_rank, is_distributed
from mmengine.logging import print_log
from mmengine.optim import build_optim_wrapper
from mmengine.registry import MODEL_WRAPPERS, MODELS, init_default_scope
from mmengine.runner import Runner

from ..dist.wrapper import batchnorm_for_cpu
from ..errors import ScalingError
from ..memory.budget import Budget, ranks_out_of_memory, release_memory
from ..memory.oom import is_oom_error
from ..scaling.search import (CACHE_FILE, MARGIN, SearchResult, Trial, cache_key, max_trials,
                              search_max_batch)
from ..utils.io import atomic_write_text
from ..utils.units import format_mib

# On a CPU the budget also holds what the Runner builds beside the model (dataloader, hooks,
# logger, visualizer): measured 80 MiB more than the probe for the 128x128 demo, so the reserve
# held free during a trial is at least this much there.
CPU_RESERVE_MIB = 160


def reserve_bytes(budget: Budget) -> int:
    """Bytes kept free during each trial: MARGIN of the budget, at least CPU_RESERVE_MIB on a
    CPU."""
    reserve = int(MARGIN * budget.nbytes)
    return max(reserve, CPU_RESERVE_MIB * 2 ** 20) if budget.device == 'cpu' else reserve


def _log(message: str) -> None:
    if get_rank() == 0:
        print_log(f'[mmddp_ext] batch probe: {message}', logger='current')


def _samples(cfg: Any, count: int) -> tuple:
    """``count`` samples of this rank's share of the training data (repeated if the dataset
    is smaller), through the training pipeline, and the dataloader's collate function."""
    loader_cfg = copy.deepcopy(cfg.train_dataloader)
    loader_cfg.update(batch_size=1, num_workers=0, persistent_workers=False)
    loader_cfg.pop('prefetch_factor', None)
    seed = (cfg.get('randomness') or {}).get('seed')
    loader = Runner.build_dataloader(loader_cfg, seed=seed)
    indices = list(itertools.islice(itertools.cycle(iter(loader.sampler)), count))
    return [loader.dataset[i] for i in indices], loader.collate_fn


@dataclass(frozen=True)
class StepOutcome:
    """One trial on this rank.

    Attributes:
        batch: The per-device batch of the trial.
        fits: Whether it ran without an out-of-memory error on this rank.
        seconds: How long it took.
        peak_bytes: With ``measure=True``: the peak of the step, on a GPU torch's peak
            allocated bytes, on a CPU the process's peak resident set size (``VmHWM``, reset
            before the step); else None.
    """

    batch: int
    fits: bool
    seconds: float
    peak_bytes: Optional[int] = None


def _status_kib(key: str) -> Optional[int]:
    """A ``/proc/self/status`` field in KiB (None where there is no such file)."""
    try:
        with open('/proc/self/status') as f:
            for line in f:
                if line.startswith(key + ':'):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def reset_peak(device: torch.device) -> bool:
    """Start a new peak measurement: torch's peak counters on a GPU; on a CPU the kernel's
    peak RSS of this process (``/proc/self/clear_refs``, Linux >= 4.0). False where the peak
    cannot be reset."""
    if device.type == 'cuda':
        torch.cuda.reset_peak_memory_stats(device)
        return True
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
        return _status_kib('VmHWM') is not None
    except OSError:
        return False


def read_peak(device: torch.device) -> Optional[int]:
    """The peak since :func:`reset_peak`, in bytes (see :class:`StepOutcome`)."""
    if device.type == 'cuda':
        return int(torch.cuda.max_memory_allocated(device))
    kib = _status_kib('VmHWM')
    return None if kib is None else kib * 1024


class Trials:
    """The model, optimizer and samples of the probe; :meth:`run` is the one training trial
    (forward + backward + optimizer step) behind the finder (:meth:`fits`, agreed by all
    ranks) and the memory forecast (:func:`measure_steps`, one process).

    Attributes:
        failed: The ranks that ran out of memory in the last agreed trial.
        grad_bytes: Bytes of the gradients of the trainable parameters (one copy).
    """

    def __init__(self, cfg: Any, device: torch.device, upper: int, reserve: int) -> None:
        self.device, self.reserve = device, reserve
        self.failed: List[int] = []
        self.samples, self.collate = _samples(cfg, upper)
        model = MODELS.build(copy.deepcopy(cfg.model)).to(device)
        if device.type == 'cpu':  # as the Runner's model will be (SyncBN needs CUDA)
            model = batchnorm_for_cpu(model)
        model.train()
        wrapper_cfg = cfg.get('model_wrapper_cfg')
        if wrapper_cfg and (is_distributed() or wrapper_cfg.get('type') == 'MicrobatchDDP'):
            self.net = MODEL_WRAPPERS.build(copy.deepcopy(dict(wrapper_cfg)),
                                            default_args=dict(module=model))
        else:
            self.net = model
        # MicrobatchDDP's gradients are views of one flat buffer for the whole run: keep them
        # (set_to_none would make each trial allocate a second copy beside it)
        self.keep_grads = hasattr(self.net, 'grads')
        self.model = model
        self.grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters()
                              if p.requires_grad)
        self.optim_wrapper = build_optim_wrapper(self.net, copy.deepcopy(cfg.optim_wrapper))

    def _step(self, batch: int) -> None:
        reserve = torch.empty(self.reserve, dtype=torch.uint8, device=self.device)
        data = self.collate(self.samples[:batch])
        with self.optim_wrapper.optim_context(self.model):
            data = self.model.data_preprocessor(data, True)
            losses = self.model._run_forward(data, mode='loss')
        loss, _ = self.model.parse_losses(losses)
        self.optim_wrapper.backward(loss)
        self.optim_wrapper.step()
        del reserve, data, losses, loss

    def run(self, batch: int, measure: bool = False) -> StepOutcome:
        """One trial at ``batch`` on this rank only (no collective); an out-of-memory error
        is a result, any other error is raised. With ``measure`` the step's peak is read."""
        measured = measure and reset_peak(self.device)
        start, ok, peak = time.monotonic(), True, None
        try:
            self._step(batch)
        except Exception as e:  # noqa: B902 - only out-of-memory errors are a result
            if not is_oom_error(e):
                raise
            ok = False
        finally:
            peak = read_peak(self.device) if measured else None
            self.optim_wrapper.zero_grad(set_to_none=not self.keep_grads)
            release_memory(self.device)
        return StepOutcome(batch, ok, round(time.monotonic() - start, 3), peak)

    def fits(self, batch: int) -> bool:
        """One trial at ``batch`` on this rank; whether it fitted on every rank (all ranks
        gather every rank's answer, so they all return the same). All ranks must call this."""
        self.failed = ranks_out_of_memory(self.run(batch).fits)
        return not self.failed

    def close(self) -> None:
        """Drop everything the probe built, before the Runner builds its own."""
        self.net = self.model = self.optim_wrapper = self.samples = None
        release_memory(self.device)


_Trials = Trials  # the name the finder's helpers used


def _cache_facts(cfg: Any, world_size: int, upper: int, device: torch.device,
                 budget_mib: Optional[int]) -> dict:
    hardware = 'cpu'
    if device.type == 'cuda':
        props = torch.cuda.get_device_properties(device)
        hardware = f'{props.name} {props.total_memory}'
    return dict(model=cfg.model, dataset=cfg.train_dataloader.get('dataset'),
                collate=cfg.train_dataloader.get('collate_fn'), optim=cfg.optim_wrapper,
                wrapper=cfg.get('model_wrapper_cfg'), world_size=world_size, upper=upper,
                hardware=hardware, budget_mib=budget_mib, margin=MARGIN,
                cpu_reserve_mib=CPU_RESERVE_MIB,
                torch=torch.__version__)


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
    atomic_write_text(path, json.dumps(dict(key=key, measured=how, margin=MARGIN,
                                            result=result.to_dict()), indent=1))


def cache_location(cfg: Any, world_size: int, upper: int, device: torch.device,
                   budget_mib: Optional[int]) -> Tuple[Optional[str], str]:
    """Where the finder's result for this run is stored (None without a work dir), and the
    key of what it depends on."""
    work_dir = cfg.get('work_dir')
    path = osp.join(work_dir, CACHE_FILE) if work_dir else None
    return path, cache_key(_cache_facts(cfg, world_size, upper, device, budget_mib))


def correct_cache(path: Optional[str], key: str, max_batch: int, why: str) -> None:
    """Store a smaller ``max_batch`` after training ran out of memory at the one the finder
    picked, so that the next run plans with it. Rank 0 writes; a no-op elsewhere or when no
    result was stored."""
    if not path or get_rank() != 0 or not osp.isfile(path):
        return
    try:
        with open(path) as f:
            stored = json.load(f)
    except (OSError, ValueError):
        return
    if stored.get('key') != key or stored['result']['max_batch'] <= max_batch:
        return
    stored.setdefault('corrections', []).append(
        dict(found=stored['result']['max_batch'], now=max_batch, why=why))
    stored['result']['max_batch'] = max_batch
    atomic_write_text(path, json.dumps(stored, indent=1))


def find_max_batch(cfg: Any, world_size: int, upper: int, budget: Budget,
                   budget_mib: Optional[int], device: torch.device) -> SearchResult:
    """The largest per-device batch in ``1..upper`` that fits on every rank. All ranks must
    call this.

    Args:
        cfg: The config (model, optimizer, train dataloader, wrapper, work_dir).
        world_size: Number of ranks (part of the cache key).
        upper: The largest batch worth trying: samples per device per optimizer step.
        budget: What is measured (from :func:`mmddp_ext.memory.budget.apply_budget`).
        budget_mib: ``scaling.memory_budget_mib`` (part of the cache key).
        device: This rank's device.

    Raises:
        ScalingError: when not even one sample per device fits.
    """
    init_default_scope(cfg.get('default_scope', 'mmengine'))
    path, key = cache_location(cfg, world_size, upper, device, budget_mib)
    result = _read_cache(path, key) if path else None
    if result is not None:
        _log(f'per-device batch {result.max_batch} fits on every rank (measured before, read '
             f'from {path}; delete it to measure again)')
        return result
    reserve = reserve_bytes(budget)
    _log(f'measuring {budget.how}; {format_mib(reserve, unit="")} of {format_mib(budget.nbytes)} '
         f'are kept free during each trial; at most {max_trials(upper)} trials of forward + '
         f'backward + optimizer step, per-device batch up to {upper}')
    trials = Trials(cfg, device, upper, reserve)

    def progress(number: int, trial: Trial) -> None:
        verdict = ('fits on every rank' if trial.fits
                   else f'out of memory on rank(s) {trials.failed}')
        _log(f'trial {number}: per-device batch {trial.batch}: {verdict} ({trial.seconds:.1f} s)')

    try:
        result = search_max_batch(upper, trials.fits, progress)
    finally:
        trials.close()
    if result.max_batch == 0:
        raise ScalingError(
            f'not even a per-device batch of 1 fits on rank(s) {trials.failed} (measured on '
            f'rank {get_rank()}: {budget.how}; {format_mib(reserve)} kept free during '
            f'each trial): raise scaling.memory_budget_mib, free memory on those ranks, use a '
            f'smaller input size or model, or train on a device with more memory')
    _log(f'per-device batch {result.max_batch} fits on every rank ({len(result.trials)} trials, '
         f'{result.seconds:.1f} s)')
    if path:
        _write_cache(path, key, result, budget.how)
    return result


@dataclass(frozen=True)
class MeasuredSteps:
    """What :func:`measure_steps` measured in this process.

    Attributes:
        steps: The measured trials, by batch (``peak_bytes`` relative to ``context_bytes`` on
            a CPU, torch's peak allocated on a GPU).
        context_bytes: What the process holds besides: on a CPU its RSS before the model is
            built (interpreter, libraries, config); on a GPU the device memory it uses outside
            torch's allocator (CUDA context, library workspaces).
        context_how: How ``context_bytes`` was read.
        grad_bytes: One copy of the trainable parameters' gradients.
        seconds: Time of the whole measurement (building the model and data included).
        method: One line: what was run and what was read.
    """

    steps: Tuple[StepOutcome, ...]
    context_bytes: int
    context_how: str
    grad_bytes: int
    seconds: float
    method: str


def _gpu_context(device: torch.device) -> Tuple[int, str]:
    """Device memory this process uses outside torch's allocator, and how it was read."""
    from ..memory.nvml import NvmlProcessTableReader, physical_device_index
    index = device.index if device.index is not None else torch.cuda.current_device()
    reserved = torch.cuda.memory_reserved(device)
    if NvmlProcessTableReader.available():
        physical = physical_device_index(index, os.environ.get('CUDA_VISIBLE_DEVICES'))
        with NvmlProcessTableReader() as reader:
            mine = [p.used_bytes for p in reader.read(physical).processes
                    if p.pid == os.getpid() and p.used_bytes is not None]
        if mine:
            return max(0, sum(mine) - reserved), 'NVML: this process on its GPU minus ' \
                'torch\'s reserved memory'
    free, total = torch.cuda.mem_get_info(device)
    return max(0, total - free - reserved), 'device used minus torch\'s reserved memory ' \
        '(no NVML: other processes on the device are counted too)'


def measure_steps(cfg: Any, batches: List[int], device: torch.device) -> MeasuredSteps:
    """Real training steps of this one process (no collective, nothing kept free): one
    warm-up at the smallest batch (optimizer state, kernel caches), then one measured
    trial per batch, smallest first; stops at the first out-of-memory error.

    Args:
        cfg: The config (model, optimizer, train dataloader; no model wrapper in one
            process, as the Runner would build it).
        batches: Per-device batches to measure, e.g. ``[8, 16, 32]``.
        device: The device to measure on.
    """
    start = time.monotonic()
    init_default_scope(cfg.get('default_scope', 'mmengine'))
    import psutil
    before = psutil.Process().memory_info().rss
    batches = sorted(set(batches))
    trials = Trials(cfg, device, batches[-1], 0)
    try:
        trials.run(batches[0])
        steps = []
        for batch in batches:
            outcome = trials.run(batch, measure=True)
            if outcome.peak_bytes is None:
                raise ScalingError(f'cannot measure the peak memory of a step on {device}: '
                                   f'/proc/self/clear_refs is not writable here; run the '
                                   f'forecast on Linux, or on a GPU')
            if not outcome.fits:
                break
            steps.append(outcome)
        grad_bytes = trials.grad_bytes
    finally:
        trials.close()
    if device.type == 'cuda':
        context, how = _gpu_context(device)
        read = "torch's peak allocated memory per step"
    else:
        context, how = before, 'RSS of this process before the model was built'
        steps = [StepOutcome(s.batch, s.fits, s.seconds, s.peak_bytes - before) for s in steps]
        read = 'the peak RSS per step (VmHWM, reset before each step) above that context'
    method = (f'{len(steps) + 1} training steps (forward + backward + optimizer step; 1 warm-up) '
              f'of the config\'s model, optimizer and data pipeline in one process on {device}, '
              f'batches {[s.batch for s in steps]}; {read}')
    return MeasuredSteps(tuple(steps), context, how, grad_bytes,
                         time.monotonic() - start, method)
