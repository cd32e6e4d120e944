"""The DDP wrapper config: lean defaults under the config's own ``model_wrapper_cfg``."""
import functools
import inspect
import logging
from typing import Any, Optional, Tuple

import torch
from mmengine.logging import print_log
from mmengine.model import convert_sync_batchnorm, revert_sync_batchnorm
from mmengine.registry import MODEL_WRAPPERS
from torch.nn.parallel import DistributedDataParallel

from ..errors import ScalingError
from ..gpu import gpus

DDP_TYPES = ('MMDistributedDataParallel', 'DistributedDataParallel', 'MicrobatchDDP')
_BUFFER_SYNC_KEYS = ('broadcast_buffers', 'forward_sync_buffers')


@functools.lru_cache(maxsize=None)
def buffer_sync_key() -> str:
    """The keyword of torch's ``DistributedDataParallel`` that turns off syncing buffers at
    every forward: ``forward_sync_buffers`` since torch 2.13 (``broadcast_buffers`` is
    deprecated there, with a FutureWarning), ``broadcast_buffers`` before."""
    params = inspect.signature(DistributedDataParallel.__init__).parameters
    return 'forward_sync_buffers' if 'forward_sync_buffers' in params else 'broadcast_buffers'


def ddp_wrapper_cfg(cfg: Any, cuda: bool, on_oom: str = 'raise') -> dict:
    """``model_wrapper_cfg`` for a distributed run: the same on every rank of a job.

    ``gradient_as_bucket_view=True`` (gradients live in DDP's buckets instead of a second
    copy), ``device_ids=None`` where tensors stay on the CPU (``cuda`` False: CPU ranks and
    the fake GPU host; MMEngine's ``[LOCAL_RANK]`` is rejected there), and
    MMEngine's own ``find_unused_parameters`` and no buffer sync at every forward (MMEngine's
    ``broadcast_buffers=False``). On torch >= 2.13 that is spelled ``forward_sync_buffers=False``
    (:func:`buffer_sync_key`), which also broadcasts the buffers from rank 0 once, when the
    model is wrapped, as the parameters are (``MicrobatchDDP`` does the same); MMEngine's
    model init gives every rank the same buffers anyway. Keys the config sets itself win (a
    config that sets either buffer key gets neither of ours); wrappers other than DDP (FSDP,
    DeepSpeed, ...) are left alone. With ``on_oom='microbatch'`` the type becomes
    :class:`~mmddp_ext.ddp.microbatch.MicrobatchDDP` (whose own ``broadcast_buffers`` is
    not deprecated).

    On a GPU the device is not written here: it differs per rank, and what is written here is
    compared across ranks before the first iteration. It is given at wrap time
    (:func:`with_rank_device`), as MMEngine gives ``[LOCAL_RANK]`` in its ``default_args``.
    """
    own = dict(cfg.get('model_wrapper_cfg') or {})
    if own.get('type', 'MMDistributedDataParallel') not in DDP_TYPES:
        if on_oom == 'microbatch':
            raise ScalingError(f"scaling.on_oom='microbatch' needs a DDP model wrapper, but "
                               f"model_wrapper_cfg.type={own['type']!r}: remove "
                               f"model_wrapper_cfg.type or set scaling.on_oom='raise'")
        return own
    unused = cfg.get('find_unused_parameters', False)
    wrapper = dict(type='MMDistributedDataParallel', find_unused_parameters=unused,
                   gradient_as_bucket_view=True)
    if not cuda:
        wrapper['device_ids'] = None
    wrapper.update(own)
    if on_oom == 'microbatch':
        wrapper['type'] = 'MicrobatchDDP'
    if not any(key in own for key in _BUFFER_SYNC_KEYS):
        key = 'broadcast_buffers' if wrapper['type'] == 'MicrobatchDDP' else buffer_sync_key()
        wrapper[key] = False
    return wrapper


def model_wrapper_for(cfg: Any, distributed: bool, on_oom: str = 'raise',
                      guard_by_default: bool = False) -> Optional[dict]:
    """The ``model_wrapper_cfg`` a run builds; the one place it is decided, for every runner.

    Distributed: the lean DDP wrapper (:func:`ddp_wrapper_cfg`), the same on every rank; the
    rank's device is given when the model is wrapped (:func:`with_rank_device`).
    Steps guarded against running out of memory (``on_oom='microbatch'``, the default with
    ``max_batch_per_device='auto'``): :class:`~mmddp_ext.ddp.microbatch.MicrobatchDDP`, in a
    single process too. A guard that only the default asked for (``guard_by_default``) gives
    way to a model wrapper of the config's own (FSDP, ...), with a warning.

    Returns:
        The wrapper config, or None when the config's own (MMEngine's default) stays.
    """
    own_type = (cfg.get('model_wrapper_cfg') or {}).get('type', 'MMDistributedDataParallel')
    if guard_by_default and on_oom == 'microbatch' and own_type not in DDP_TYPES:
        print_log(
            f"[mmddp_ext] model_wrapper_cfg.type={own_type!r}: the batch the finder "
            'picks is not guarded against running out of memory during training', logger='current',
            level=logging.WARNING)
        on_oom = 'raise'
    if distributed:
        return ddp_wrapper_cfg(cfg, gpus().tensors_on_gpu(), on_oom)
    return dict(type='MicrobatchDDP') if on_oom == 'microbatch' else None


def sync_bn_layers(model: Any) -> int:
    """How many SyncBN layers (torch's ``nn.SyncBatchNorm``, mmcv's ``SyncBatchNorm``) the
    model has."""
    kinds = [torch.nn.SyncBatchNorm]
    try:
        from mmcv.ops import SyncBatchNorm as MMCVSyncBN  # here: mmcv's compiled ops are optional
        kinds.append(MMCVSyncBN)
    except ImportError:
        pass
    return sum(isinstance(m, tuple(kinds)) for m in model.modules())


def batchnorm_for_cpu(model: Any) -> Any:
    """The model with its SyncBN layers as plain BatchNorm, for training on CPUs (gloo): SyncBN
    needs CUDA (DDP refuses it on a CPU module: ``SyncBatchNorm layers only work with GPU
    modules``). Logs how many layers were converted; a model without SyncBN is returned as is.
    On GPUs SyncBN stays, and MMEngine already reverts it in a single process."""
    count = sync_bn_layers(model)
    if not count:
        return model
    print_log(
        f'[mmddp_ext] training on CPUs: {count} SyncBN layer(s) converted to BatchNorm '
        '(SyncBN needs CUDA; statistics are per process, as in a single process); on GPUs '
        'SyncBN stays', logger='current')
    return revert_sync_batchnorm(model)


def with_rank_device(wrapper: Optional[dict]) -> Tuple[Optional[dict], Optional[str]]:
    """A copy of ``wrapper`` (a run's ``model_wrapper_cfg``) with this rank's ``device_ids``,
    for the model's wrapping only (the config keeps none: it is compared across ranks).

    A torch DDP type whose ``device_ids`` the config does not set gets ``[current GPU]`` on a
    GPU rank (its pinned device: ``cuda:1`` on local rank 1). The fake GPU host makes the same
    decision and gives torch ``None`` (its tensors stay on the CPU), said in the returned line;
    CPU ranks keep ``None``. Other wrappers (``MicrobatchDDP``, FSDP) take no device ids.

    Returns:
        (the wrapper to build, a line for the log or None).
    """
    if wrapper is None or wrapper.get('device_ids') is not None or not gpus().available():
        return wrapper, None
    kind = MODEL_WRAPPERS.get(wrapper.get('type', 'MMDistributedDataParallel'))
    if not (isinstance(kind, type) and issubclass(kind, DistributedDataParallel)):
        return wrapper, None
    decided = [gpus().current()]
    if gpus().tensors_on_gpu():
        return dict(wrapper, device_ids=decided), None
    return dict(wrapper, device_ids=None), gpus().replaced('DDP device_ids', decided, None)


def sync_bn_for_rank(model: Any, sync_bn: Optional[str]) -> Tuple[Any, Optional[str]]:
    """The model's SyncBN as this distributed rank trains it, and a line for the log.

    A GPU rank keeps its SyncBN layers, and MMEngine converts BatchNorm by ``sync_bn``: the
    model is returned as is. The fake GPU host decides the same (``sync_bn`` applied with
    MMEngine's ``convert_sync_batchnorm``, every SyncBN layer kept and counted), then gives its
    CPU tensors plain BatchNorm, since SyncBN needs CUDA. A CPU rank gets
    :func:`batchnorm_for_cpu`. Where the model is not returned as is, the caller must keep
    MMEngine from converting again (``cfg.sync_bn = None``).
    """
    if gpus().tensors_on_gpu():
        return model, None
    if not gpus().available():
        model = batchnorm_for_cpu(model)
        return model, None if sync_bn is None else (
            f'training on CPUs: sync_bn={sync_bn!r} ignored (SyncBN needs CUDA)')
    if sync_bn is not None:
        model = convert_sync_batchnorm(model, sync_bn)
    count = sync_bn_layers(model)
    if not count:
        return model, None
    return revert_sync_batchnorm(model), gpus().replaced('SyncBN', f'{count} layer(s) kept',
                                                         'BatchNorm')


def ddp_param_names(model: Any) -> list:
    """The parameter names of ``model`` (a DDP-wrapped one: of its module) in the order DDP
    indexes them in its errors ("Parameter indices which did not receive grad"): the
    parameters that require a gradient, shared ones once, as ``named_parameters`` yields
    them."""
    module = getattr(model, 'module', model)
    return [n for n, p in module.named_parameters() if p.requires_grad]
