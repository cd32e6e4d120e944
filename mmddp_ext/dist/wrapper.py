"""The DDP wrapper config: lean defaults under the config's own ``model_wrapper_cfg``."""
from typing import Any

from ..errors import ScalingError

DDP_TYPES = ('MMDistributedDataParallel', 'DistributedDataParallel', 'MicrobatchDDP')


def ddp_wrapper_cfg(cfg: Any, cuda: bool, local_rank: int, on_oom: str = 'raise') -> dict:
    """``model_wrapper_cfg`` for a distributed run.

    ``gradient_as_bucket_view=True`` (gradients live in DDP's buckets instead of a second
    copy), ``device_ids=None`` on CPU (MMEngine's ``[LOCAL_RANK]`` is rejected there), and
    MMEngine's own ``broadcast_buffers=False`` / ``find_unused_parameters``. Keys the config
    sets itself win; wrappers other than DDP (FSDP, DeepSpeed, ...) are left alone. With
    ``on_oom='microbatch'`` the type becomes :class:`~mmddp_ext.dist.microbatch.MicrobatchDDP`.
    """
    own = dict(cfg.get('model_wrapper_cfg') or {})
    if own.get('type', 'MMDistributedDataParallel') not in DDP_TYPES:
        if on_oom == 'microbatch':
            raise ScalingError(f"scaling.on_oom='microbatch' needs a DDP model wrapper, but "
                               f"model_wrapper_cfg.type={own['type']!r}: remove "
                               f"model_wrapper_cfg.type or set scaling.on_oom='raise'")
        return own
    wrapper = dict(type='MMDistributedDataParallel', broadcast_buffers=False,
                   find_unused_parameters=cfg.get('find_unused_parameters', False),
                   gradient_as_bucket_view=True, device_ids=[local_rank] if cuda else None)
    wrapper.update(own)
    if on_oom == 'microbatch':
        wrapper['type'] = 'MicrobatchDDP'
    return wrapper


def sync_bn_layers(model: Any) -> int:
    """How many SyncBN layers (torch's ``nn.SyncBatchNorm``, mmcv's ``SyncBatchNorm``) the
    model has."""
    import torch
    kinds = [torch.nn.SyncBatchNorm]
    try:
        from mmcv.ops import SyncBatchNorm as MMCVSyncBN
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
    from mmengine.logging import print_log
    from mmengine.model import revert_sync_batchnorm
    print_log(f'[mmddp_ext] training on CPUs: {count} SyncBN layer(s) converted to BatchNorm '
              '(SyncBN needs CUDA; statistics are per process, as in a single process); on GPUs '
              'SyncBN stays', logger='current')
    return revert_sync_batchnorm(model)
