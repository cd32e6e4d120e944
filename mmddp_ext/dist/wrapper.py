"""The DDP wrapper config: lean defaults under the config's own ``model_wrapper_cfg``."""
from typing import Any

DDP_TYPES = ('MMDistributedDataParallel', 'DistributedDataParallel')


def ddp_wrapper_cfg(cfg: Any, cuda: bool, local_rank: int) -> dict:
    """``model_wrapper_cfg`` for a distributed run.

    ``gradient_as_bucket_view=True`` (gradients live in DDP's buckets instead of a second
    copy), ``device_ids=None`` on CPU (MMEngine's ``[LOCAL_RANK]`` is rejected there), and
    MMEngine's own ``broadcast_buffers=False`` / ``find_unused_parameters``. Keys the config
    sets itself win; wrappers other than DDP (FSDP, DeepSpeed, ...) are left alone.
    """
    own = dict(cfg.get('model_wrapper_cfg') or {})
    if own.get('type', 'MMDistributedDataParallel') not in DDP_TYPES:
        return own
    wrapper = dict(type='MMDistributedDataParallel', broadcast_buffers=False,
                   find_unused_parameters=cfg.get('find_unused_parameters', False),
                   gradient_as_bucket_view=True, device_ids=[local_rank] if cuda else None)
    wrapper.update(own)
    return wrapper
