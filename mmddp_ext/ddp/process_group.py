"""Process-group set-up and tear-down: what every rank runs to join the job.

:func:`ensure_process_group` starts the group before the Runner is built, instead of MMEngine's
``init_dist('pytorch')``, which always calls ``torch.cuda.set_device`` (it fails on a CPU host)
and waits up to 30 minutes for a missing rank; ``Runner.setup_env`` then skips it. The
rendezvous, its messages and the loopback-only sockets: docs/launching.md, 'The six ways' and
'Mistakes and what they print'.
"""
import os
from datetime import timedelta
from typing import List, Optional, Tuple

import torch.distributed as dist

from mmddp_launch.rendezvous import is_loopback
from mmddp_launch.rendezvous import log as _log
from mmddp_launch.rendezvous import pin_loopback_interfaces

from ..gpu import gpus
from ..launcher.env import DistEnv
from ..launcher.layout import read_launch_env
from ..launcher.store import agent_store, rendezvous_store, rendezvous_timeout


def choose_backend(requested: Optional[str], cuda_available: bool) -> Tuple[str, Optional[str]]:
    """The process-group backend: nccl with CUDA, gloo without; a config's request wins unless
    it asks for nccl where there is no GPU (MMPose's base configs always say nccl).

    Returns:
        (backend, warning or None).
    """
    if requested is None:
        return ('nccl' if cuda_available else 'gloo'), None
    if requested == 'nccl' and not cuda_available:
        return 'gloo', ("env_cfg.dist_cfg.backend='nccl' needs CUDA GPUs and none is "
                        "available: using 'gloo'")
    return requested, None


def pin_device(local_rank: int) -> Optional[int]:
    """Make GPU ``local_rank`` this process's device when it has GPUs; returns the index."""
    g = gpus()
    if not g.available():
        return None
    g.set_device(local_rank)
    return local_rank


def init_distributed(env: DistEnv, backend: Optional[str] = None,
                     timeout: Optional[float] = None) -> Tuple[str, Optional[str]]:
    """Pin the device, then initialise the default process group. All ranks must call this.

    The CUDA device is pinned to LOCAL_RANK first, so no CUDA context lands on GPU 0 by
    accident. Under torchrun the agent's store is used (``env://``). Started by hand (or by
    Slurm), rank 0 opens the TCP store itself with a bounded rendezvous timeout
    (``MMDDP_RENDEZVOUS_TIMEOUT``): a port already in use (named with the process holding
    it), an unreachable master, or fewer processes than WORLD_SIZE each end with one line that
    names MASTER_ADDR/MASTER_PORT/WORLD_SIZE and the fix; until then the waiting ranks say what
    they wait for every ``MMDDP_RENDEZVOUS_LOG_EVERY`` seconds (30). With a loopback
    MASTER_ADDR (all ranks on this host) the store listens on that address only and
    GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME name the loopback interface unless set.

    Args:
        env: from :func:`mmddp_ext.launcher.env.read_dist_env`.
        backend: requested backend (``env_cfg.dist_cfg.backend``); None picks nccl/gloo.
        timeout: collective timeout in seconds (default: torch's 30 minutes).

    Returns:
        (backend used, warning or None).
    """
    os.environ.update(env.as_environ())  # MMEngine and samplers read these
    pin_device(env.local_rank)
    if is_loopback(env.master_addr or ''):  # all ranks on this host: gloo/NCCL on loopback too
        note = pin_loopback_interfaces(os.environ)
        if note and env.rank == 0:
            _log(note)
    backend, warning = choose_backend(backend, gpus().available())
    if backend == 'nccl' and not gpus().tensors_on_gpu():  # the fake GPU host
        backend, warning = 'gloo', gpus().replaced('process-group backend', 'nccl', 'gloo')
    kwargs = dict(backend=backend, rank=env.rank, world_size=env.world_size)
    if timeout is not None:
        kwargs['timeout'] = timedelta(seconds=timeout)
    if env.under_torchrun and os.environ.get('TORCHELASTIC_USE_AGENT_STORE') == 'True':
        dist.init_process_group(store=agent_store(env), **kwargs)
    elif env.under_torchrun:
        dist.init_process_group(init_method='env://', **kwargs)
    else:
        dist.init_process_group(store=rendezvous_store(env, rendezvous_timeout()), **kwargs)
    return backend, warning


def ensure_process_group(launcher: str, dist_cfg: Optional[dict] = None,
                         env: Optional[DistEnv] = None) -> List[str]:
    """The one way a run starts its process group: unless the run is not distributed
    (``launcher == 'none'``) or a group exists already, pin this rank's GPU and initialise the
    group (:func:`init_distributed`). Called before any CUDA work and before the Runner is
    built (so MMEngine's CUDA-only ``init_dist`` never runs), by :func:`~.join.join_job`, and
    by :class:`~mmddp_ext.runner.DDPRunner`'s ``setup_env`` for a DDPRunner constructed
    directly.

    Args:
        launcher: The config's ``launcher``.
        dist_cfg: ``env_cfg.dist_cfg`` (``backend``, ``timeout`` in seconds).
        env: The launcher's environment, when the caller read it already.

    Returns:
        Lines for the log (the backend, a warning about it), empty when nothing was done.
    """
    if launcher == 'none' or (dist.is_available() and dist.is_initialized()):
        return []
    dist_cfg = dist_cfg or {}
    backend, warning = init_distributed(
        env or read_launch_env(launcher), dist_cfg.get('backend'), dist_cfg.get('timeout'))
    return [f'process group: {backend}'] + ([warning] if warning else [])


def shutdown() -> None:
    """Barrier, then destroy the process group, so gloo does not abort at interpreter exit.

    All ranks must call this (it is a no-op when no process group exists).
    """
    if dist.is_available() and dist.is_initialized():
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()
