"""One training step on a model of its own, measured: the trial behind the batch finder
(:mod:`mmddp_ext.batch_finder.finder`) and the memory forecast (:func:`measure_steps`, for
``dist_train.py --explain --memory``).

:class:`Trials` builds the model from ``cfg.model`` on a device, wrapped as the Runner will
wrap it, the optimizer from ``cfg.optim_wrapper`` and real samples from
``cfg.train_dataloader``; :meth:`Trials.run` is forward + backward + optimizer step on a batch
of them, on the inner model (no collective inside), optionally reading the step's peak memory.
"""
import copy
import itertools
import os
import time
from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Tuple

import torch
from mmengine.dist import get_rank, is_distributed
from mmengine.optim import build_optim_wrapper
from mmengine.registry import MODEL_WRAPPERS, MODELS, init_default_scope
from mmengine.runner import Runner

from ..ddp.wrapper import batchnorm_for_cpu
from ..errors import ScalingError
from ..gpu import gpus, physical, tensor_device
from ..memory.budget import MARGIN, Budget
from ..memory.peak import read_peak, reset_peak
from ..oom.classify import is_oom_error
from ..oom.onednn import turn_off_onednn_after
from ..oom.ranks_out_of_memory import ranks_out_of_memory
from ..oom.release import release_memory
from ..utils.batch import forward_loss
from ..utils.memory_reads import rss_bytes
from .heaviest import fixed_size, heaviest, resize_rule, size_of

# On a CPU the budget also holds what the Runner builds beside the model (dataloader and its
# worker queues' threads, datasets, evaluator, hooks, logger, visualizer): the reserve held
# free during a trial covers that for the demo (docs/scaling.md, docs/benchmarks.md).
CPU_RESERVE_MIB = 160


def reserve_bytes(budget: Budget) -> int:
    """Bytes kept free during each trial: MARGIN of the budget, at least CPU_RESERVE_MIB on a
    CPU."""
    reserve = int(MARGIN * budget.nbytes)
    return max(reserve, CPU_RESERVE_MIB * 2**20) if budget.device == 'cpu' else reserve


def _pipeline_of(dataset_cfg: Any) -> list:
    """The pipeline of a dataset config, through wrappers (``RepeatDataset``'s ``dataset``)."""
    while isinstance(dataset_cfg, Mapping) and 'pipeline' not in dataset_cfg:
        dataset_cfg = dataset_cfg.get('dataset') or {}
    return list((dataset_cfg or {}).get('pipeline') or [])


def choose_samples(cfg: Any, dataset: Any, share: List[int], count: int,
                   rank: int) -> Tuple[List[int], str]:
    """The ``count`` indices of this rank's ``share`` the trials run on, and one line saying
    which: the heaviest batch its share can make where the dataset gives each sample's size
    (:mod:`.heaviest`), else the first ones (the share repeated when it is smaller)."""
    if not share:
        raise ScalingError(f'rank {rank} has no training samples: the dataset is empty')
    first = [share[k % len(share)] for k in range(count)]
    whose = f"rank {rank}'s share"
    pipeline = _pipeline_of(cfg.train_dataloader.get('dataset'))
    if fixed_size(pipeline):
        return first, (f'the first {count} of {whose}: the pipeline crops every sample to one '
                       'size, so any batch weighs the same')
    sizes = []
    for index in dict.fromkeys(share):
        try:
            size = size_of(index, dataset.get_data_info(index))
        except (AttributeError, KeyError, IndexError, TypeError):
            size = None
        if size is None:
            return first, (f'the first {count} of {whose}: the dataset gives no image size '
                           'to find its heaviest batch by')
        sizes.append(size)
    divisor = ((cfg.model.get('data_preprocessor') or {}).get('pad_size_divisor') or 1)
    sampler = str((cfg.train_dataloader.get('batch_sampler') or {}).get('type', ''))
    found = heaviest(sizes, count, resize_rule(pipeline), divisor, whose, by_aspect='AspectRatio'
                     in sampler)
    if found is None:
        return first, (f'the first {count} of {whose}: its samples are of one size and one '
                       'object count, so any batch weighs the same')
    return found.indices, found.note


def _samples(cfg: Any, count: int) -> tuple:
    """``count`` samples of this rank's share of the training data (:func:`choose_samples`),
    through the training pipeline; the dataloader's collate function; which samples and why."""
    loader_cfg = copy.deepcopy(cfg.train_dataloader)
    loader_cfg.update(batch_size=1, num_workers=0, persistent_workers=False)
    loader_cfg.pop('prefetch_factor', None)
    seed = (cfg.get('randomness') or {}).get('seed')
    loader = Runner.build_dataloader(loader_cfg, seed=seed)
    # one epoch of this rank's order (an infinite sampler gives as many); the sampler is the
    # batch sampler's where the config has one (MMDetection's AspectRatioBatchSampler), not
    # the DataLoader's own, which is then a sequential one over the whole dataset
    sampler = getattr(loader.batch_sampler, 'sampler', None) or loader.sampler
    share = list(itertools.islice(iter(sampler), len(sampler)))
    indices, note = choose_samples(cfg, loader.dataset, share, count, get_rank())
    return [loader.dataset[i] for i in indices], loader.collate_fn, note


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


class Trials:
    """The model, optimizer and samples of the probe; :meth:`run` is the one training trial
    (forward + backward + optimizer step) behind the finder (:meth:`fits`, agreed by all
    ranks) and the memory forecast (:func:`measure_steps`, one process).

    Attributes:
        failed: The ranks that ran out of memory in the last agreed trial.
        sample_note: Which samples the trials run on and why (:func:`choose_samples`).
        grad_bytes: Bytes of the gradients of the trainable parameters (one copy).
    """

    def __init__(self, cfg: Any, device: torch.device, upper: int, reserve: int) -> None:
        self.device, self.reserve = device, reserve
        self.tensors = tensor_device(device)  # the fake GPUs' tensors stay on the CPU
        self.failed: List[int] = []
        self.samples, self.collate, self.sample_note = _samples(cfg, upper)
        model = MODELS.build(copy.deepcopy(cfg.model)).to(self.tensors)
        if self.tensors.type == 'cpu':  # as the Runner's model will be (SyncBN needs CUDA)
            model = batchnorm_for_cpu(model)
        model.train()
        wrapper_cfg = cfg.get('model_wrapper_cfg')
        if wrapper_cfg and (is_distributed() or wrapper_cfg.get('type') == 'MicrobatchDDP'):
            self.net = MODEL_WRAPPERS.build(
                copy.deepcopy(dict(wrapper_cfg)), default_args=dict(module=model))
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
        reserve = torch.empty(self.reserve, dtype=torch.uint8, device=self.tensors)
        data = self.collate(self.samples[:batch])
        with self.optim_wrapper.optim_context(self.model):
            data = self.model.data_preprocessor(data, True)
            losses = forward_loss(self.model, data)
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
            turn_off_onednn_after(e)  # else every later trial fails in oneDNN
        finally:
            peak = read_peak(self.device) if measured else None
            self.optim_wrapper.zero_grad(set_to_none=not self.keep_grads)
            release_memory(self.tensors)
        return StepOutcome(batch, ok, round(time.monotonic() - start, 3), peak)

    def fits(self, batch: int) -> bool:
        """One trial at ``batch`` on this rank; whether it fitted on every rank (all ranks
        gather every rank's answer, so they all return the same). All ranks must call this."""
        self.failed = ranks_out_of_memory(self.run(batch).fits)
        return not self.failed

    def close(self) -> None:
        """Drop everything the probe built, before the Runner builds its own."""
        self.net = self.model = self.optim_wrapper = self.samples = None
        release_memory(self.tensors)


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
    g = gpus()
    index = device.index if device.index is not None else g.current()
    reserved = g.reserved(index)
    if g.nvml_available():
        _, rows = g.process_table(physical(index))
        mine = [used for pid, used in rows if pid == os.getpid() and used is not None]
        if mine:
            return max(0, sum(mine) - reserved), 'NVML: this process on its GPU minus ' \
                'torch\'s reserved memory'
    free, total = g.mem_get_info(index)
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
    before = rss_bytes()
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
        grad_bytes, samples = trials.grad_bytes, trials.sample_note
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
              f'batches {[s.batch for s in steps]} of {samples}; {read}')
    return MeasuredSteps(tuple(steps), context, how, grad_bytes, time.monotonic() - start, method)
