"""``--explain``'s measurements for the node's figures (:mod:`mmddp_ext.node.limits`): one rank's
training batch in bytes, one DataLoader worker's own memory and this process's with the dataset
built (a real loader with one worker, two batches), and the model's BatchNorm layers that
normalise over the batch in training. Each is best effort: where the data or the model cannot
be built here (a recipe whose dataset is on the cluster), the reason is kept instead."""
import copy
from dataclasses import dataclass
from typing import Any, Optional

import psutil
import torch
from mmengine.registry import MODELS, init_default_scope
from mmengine.runner import Runner

from ..utils.memory_reads import rss_bytes
from .limits import batchnorm_warning

BATCHNORMS = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d)


@dataclass(frozen=True)
class LoadingSample:
    """What one rank's loading was measured at (None where it was not), and why not."""

    batch_bytes: Optional[int] = None
    worker_bytes: Optional[int] = None
    process_bytes: Optional[int] = None
    not_measured: str = ''


def tensor_bytes(data: Any) -> int:
    """Bytes of every tensor in ``data`` (lists, tuples, dicts, MMEngine's data elements): what
    a DataLoader worker hands over through shared memory; other objects travel pickled."""
    if isinstance(data, torch.Tensor):
        return data.untyped_storage().nbytes()
    if isinstance(data, dict):
        return sum(tensor_bytes(v) for v in data.values())
    if isinstance(data, (list, tuple)):
        return sum(tensor_bytes(v) for v in data)
    values = getattr(data, 'all_values', None)  # BaseDataElement: its fields
    return sum(tensor_bytes(v) for v in values()) if callable(values) else 0


def measure_loading(cfg: Any, batch: int) -> LoadingSample:
    """Load two batches of ``batch`` samples through ``cfg.train_dataloader`` with one worker
    (none where the config has none): their tensor bytes, the worker's own memory (USS: what
    it does not share with this process) and this process's RSS."""
    workers = int(cfg.train_dataloader.get('num_workers', 0) or 0)
    loader_cfg = copy.deepcopy(cfg.train_dataloader)
    loader_cfg.update(batch_size=batch, num_workers=min(workers, 1), persistent_workers=False)
    if not workers:
        loader_cfg.pop('prefetch_factor', None)
    try:
        init_default_scope(cfg.get('default_scope') or 'mmengine')
        loader = Runner.build_dataloader(loader_cfg, seed=(cfg.get('randomness') or {}).get('seed'))
        before = {p.pid for p in psutil.Process().children()}
        batches = iter(loader)
        first = next(batches)
        next(batches, None)
        worker = None
        if workers:
            started = [p for p in psutil.Process().children() if p.pid not in before]
            worker = started[0].memory_full_info().uss if started else None
        sample = LoadingSample(tensor_bytes(first), worker, rss_bytes())
        del batches
        return sample
    except Exception as e:  # the data is not here: the figures say why they are unknown
        return LoadingSample(not_measured=f'the training data could not be loaded here '
                             f'({type(e).__name__}: {str(e)[:120]})')


def training_batchnorms(cfg: Any) -> Optional[int]:
    """How many of the model's plain BatchNorm layers normalise over the batch in training
    (frozen ones, ``norm_eval=True``, and SyncBN do not count); None where the model cannot
    be built here."""
    try:
        init_default_scope(cfg.get('default_scope') or 'mmengine')
        model = MODELS.build(copy.deepcopy(cfg.model))
    except Exception:
        return None
    model.train()
    return count_training_batchnorms(model)


def count_training_batchnorms(model: torch.nn.Module) -> int:
    """The plain BatchNorm layers of ``model`` in training mode (a model that is training:
    its frozen ones, ``norm_eval=True``, are in eval mode; SyncBN is no plain BatchNorm)."""
    return sum(1 for m in model.modules() if isinstance(m, BATCHNORMS) and m.training)


def runner_batchnorm_warning(runner: Any) -> Optional[str]:
    """:func:`~mmddp_ext.node.limits.batchnorm_warning` for the runner's model at its
    per-device batch (each micro-batch's, where ``MicrobatchDDP`` splits it)."""
    model, loader = runner.model, runner.train_dataloader
    plan = getattr(runner, 'scaling_plan', None)
    # the plan's; else the loader's, or its batch sampler's (MMDetection's aspect-ratio one)
    batch = (
        plan.per_device_batch_size if plan is not None else getattr(loader, 'batch_size', None)
        or getattr(getattr(loader, 'batch_sampler', None), 'batch_size', None))
    if not batch:
        return None
    micro = int(getattr(model, 'micro_batches', 1) or 1)
    samples = -(-batch // micro)
    why = []
    if getattr(runner, 'batch_probe', None) is not None:
        why.append(f'the batch finder chose per-device batch {batch}')
    if micro > 1:
        why.append(f'{micro} micro-batches of at most {samples}')
    return batchnorm_warning(count_training_batchnorms(model), samples, '; '.join(why))
