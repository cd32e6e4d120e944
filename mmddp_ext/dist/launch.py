"""Process-group set-up and tear-down, and ``launch_workers``: the elastic agent running a
given function on N local processes (``mmddp_ext.launch`` hands it the training entry).

:func:`ensure_process_group` starts the group before the Runner is built, instead of MMEngine's
``init_dist('pytorch')``, which always calls ``torch.cuda.set_device`` (it fails on a CPU host)
and waits up to 30 minutes for a missing rank; ``Runner.setup_env`` then skips it. The
rendezvous, its messages and the loopback-only sockets: docs/reliability.md, 'What a failure
looks like: the launcher' and 'Loopback only: gloo and NCCL too'.
"""
import os
from datetime import timedelta
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple

from ..gpu import gpus
from ..utils.checks import positive_int
from ..utils.process_state import restore, snapshot
from . import slurm
from .env import DistEnv, DistEnvError, choose_backend, detect_launcher, read_dist_env
from .rendezvous import (DEFAULT_LOG_EVERY, DEFAULT_TIMEOUT, LOG_EVERY_ENV, TIMEOUT_ENV,
                         find_free_port, is_loopback, listen_on)
from .rendezvous import log as _log
from .rendezvous import (loopback_store, pin_loopback_interfaces, port_free, port_in_use_message,
                         seconds_from_env, unreachable_causes, wait_for_listener, wait_until)

RENDEZVOUS_TIMEOUT_ENV = TIMEOUT_ENV
DEFAULT_RENDEZVOUS_TIMEOUT = DEFAULT_TIMEOUT


def rendezvous_timeout() -> float:
    """Seconds to wait for all ranks to meet (env ``MMDDP_RENDEZVOUS_TIMEOUT``, default 300)."""
    return _seconds(RENDEZVOUS_TIMEOUT_ENV, DEFAULT_RENDEZVOUS_TIMEOUT)


def _seconds(name: str, default: float) -> float:
    try:
        return seconds_from_env(os.environ, name, default)
    except ValueError as e:
        raise DistEnvError(str(e)) from None


def read_launch_env(launcher: Optional[str] = None, num_gpus: Optional[int] = None,
                    environ: Optional[Mapping[str, str]] = None) -> DistEnv:
    """:func:`~mmddp_ext.dist.env.read_dist_env` of ``environ`` (default ``os.environ``) with
    ``num_gpus`` (default: the GPUs visible to this process), the one rule for this rank's
    layout (a missing ``LOCAL_RANK`` is derived from the GPU count); under Slurm with the
    address of the step's first node asked from Slurm (:func:`mmddp_ext.dist.slurm.master_addr`:
    its ``NodeAddr``, which every node reaches)."""
    environ = os.environ if environ is None else environ
    num_gpus = gpus().count() if num_gpus is None else num_gpus
    launcher = launcher or detect_launcher(environ)
    addr = slurm.master_addr(environ) if launcher == 'slurm' else None
    return read_dist_env(environ, launcher, num_gpus, slurm_master_addr=addr)


def pin_device(local_rank: int) -> Optional[int]:
    """Make GPU ``local_rank`` this process's device when it has GPUs; returns the index."""
    g = gpus()
    if not g.available():
        return None
    g.set_device(local_rank)
    return local_rank


def check_port_free(port: int) -> None:
    """Raise DistEnvError when ``port`` is already bound on this host (rank 0 only); the message
    names the process holding it where this user can see it."""
    if not port_free(port):
        raise DistEnvError(
            port_in_use_message('MASTER_PORT', port, 'choose a free port for every process'))


def _open_store(env: DistEnv, timeout: float):
    """Rank 0: host the TCP store (on 127.0.0.1 only when MASTER_ADDR is a loopback address).
    Other ranks: wait for it (saying so every MMDDP_RENDEZVOUS_LOG_EVERY seconds), then join."""
    import torch.distributed as dist
    where = f'MASTER_ADDR={env.master_addr} MASTER_PORT={env.master_port}'
    kwargs = dict(timeout=timedelta(seconds=timeout), wait_for_workers=False)
    if env.rank == 0 and is_loopback(env.master_addr):
        host = '127.0.0.1' if env.master_addr == 'localhost' else env.master_addr
        try:
            sock = listen_on(host, env.master_port)
        except OSError:
            check_port_free(env.master_port)  # names the holder
            raise
        return dist.TCPStore(host, env.master_port, env.world_size, True,
                             master_listen_fd=sock.detach(), **kwargs)
    if env.rank == 0:
        check_port_free(env.master_port)
        return dist.TCPStore(env.master_addr, env.master_port, env.world_size, True, **kwargs)
    error = wait_for_listener(
        env.master_addr, env.master_port, timeout, _seconds(LOG_EVERY_ENV, DEFAULT_LOG_EVERY),
        lambda s: (f'rank {env.rank} waiting for rank 0 at {env.master_addr}:'
                   f'{env.master_port} ({s:.0f} s)'))
    if error is not None:
        raise DistEnvError(
            f'rank {env.rank} could not reach the rank-0 store at {where} within {timeout:.0f} '
            f's ({error}; {RENDEZVOUS_TIMEOUT_ENV} sets the wait): '
            f'{unreachable_causes("rank 0", "MASTER_PORT")}')
    return dist.TCPStore(env.master_addr, env.master_port, env.world_size, False, **kwargs)


def _rendezvous(env: DistEnv, timeout: float):
    """Open the TCP store (rank 0 hosts it) and wait until all ranks have joined."""
    where = f'MASTER_ADDR={env.master_addr} MASTER_PORT={env.master_port}'
    try:
        store = _open_store(env, timeout)
    except DistEnvError:
        raise
    except Exception as e:  # DistNetworkError / RuntimeError, depending on torch
        if env.rank == 0:
            raise DistEnvError(f'rank 0 could not open the rendezvous store at {where}: '
                               f'{str(e).splitlines()[0]}') from e
        raise DistEnvError(
            f'rank {env.rank} reached the rank-0 store at {where} but could not join it within '
            f'{timeout:.0f} s ({RENDEZVOUS_TIMEOUT_ENV} sets the wait): '
            f'{str(e).splitlines()[0]}') from e
    joined = [0]

    def all_joined() -> Optional[bool]:
        joined[0] = store.add('mmddp_ext/joined', 0)
        return True if joined[0] >= env.world_size else None

    try:
        store.add('mmddp_ext/joined', 1)
        if not wait_until(
                all_joined, timeout, _seconds(LOG_EVERY_ENV, DEFAULT_LOG_EVERY),
                lambda s: f'rank {env.rank} waiting at {env.master_addr}:{env.master_port}: '
                f'{joined[0]} of WORLD_SIZE={env.world_size} processes joined ({s:.0f} s)',
                interval=0.05):
            raise DistEnvError(
                f'only {joined[0]} of WORLD_SIZE={env.world_size} processes joined at {where} '
                f'within {timeout:.0f} s: start the missing ranks, or set WORLD_SIZE to the '
                'number of processes you start')
    except DistEnvError:
        raise
    except Exception as e:
        raise DistEnvError(f'rank {env.rank} lost the rendezvous store at {where} (did rank 0 '
                           f'stop? see its error): {str(e).splitlines()[0]}') from e
    return store


def _agent_store(env: DistEnv):
    """A client of the torchrun agent's store, namespaced by restart attempt.

    torchrun's static rendezvous keeps one store across restarts and torch's ``env://`` adds no
    per-attempt prefix, so restarted workers would read the dead workers' gloo addresses
    ("Connection refused"). Keys of attempt N live under ``mmddp_ext/attempt_N/``.
    """
    import torch.distributed as dist
    store = dist.TCPStore(env.master_addr, env.master_port, env.world_size, is_master=False,
                          timeout=timedelta(seconds=rendezvous_timeout()))
    attempt = os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')
    return dist.PrefixStore(f'mmddp_ext/attempt_{attempt}/', store)


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
        env: from :func:`mmddp_ext.dist.env.read_dist_env`.
        backend: requested backend (``env_cfg.dist_cfg.backend``); None picks nccl/gloo.
        timeout: collective timeout in seconds (default: torch's 30 minutes).

    Returns:
        (backend used, warning or None).
    """
    import torch.distributed as dist
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
        dist.init_process_group(store=_agent_store(env), **kwargs)
    elif env.under_torchrun:
        dist.init_process_group(init_method='env://', **kwargs)
    else:
        dist.init_process_group(store=_rendezvous(env, rendezvous_timeout()), **kwargs)
    return backend, warning


def ensure_process_group(launcher: str, dist_cfg: Optional[dict] = None,
                         env: Optional[DistEnv] = None) -> List[str]:
    """The one way a run starts its process group: unless the run is not distributed
    (``launcher == 'none'``) or a group exists already, pin this rank's GPU and initialise the
    group (:func:`init_distributed`). Every entry point calls it before any CUDA work:
    ``tools/dist_train.py`` before it builds the runner (so MMEngine's CUDA-only ``init_dist``
    never runs), :class:`~mmddp_ext.runner.DDPRunner` when built from another entry point
    (MMPose's or MMDetection's ``tools/train.py``, ``Runner.from_cfg`` in a script).

    Args:
        launcher: The config's ``launcher``.
        dist_cfg: ``env_cfg.dist_cfg`` (``backend``, ``timeout`` in seconds).
        env: The launcher's environment, when the caller read it already.

    Returns:
        Lines for the log (the backend, a warning about it), empty when nothing was done.
    """
    import torch.distributed as dist
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
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()


def launch_workers(main_func: Callable[..., Any], argv: Sequence[str] = (), nproc_per_node: int = 1,
                   nnodes: int = 1, node_rank: int = 0, master_addr: str = '127.0.0.1',
                   master_port: Optional[int] = None, max_restarts: int = 0,
                   run_id: Optional[str] = None, start_method: str = 'spawn') -> dict:
    """Run ``main_func(list(argv))`` in ``nproc_per_node`` local processes under
    torch.distributed.elastic (the agent starts, watches and restarts them), as torchrun
    would: the launcher is handed the function to run; it never imports the training entry.

    A single node on a loopback ``master_addr`` gets its store on that address only and
    gloo/NCCL pinned to the loopback interface (see :mod:`mmddp_ext.dist.run_front`).

    Args:
        main_func: a picklable function of the worker's argument list.
        argv: its arguments.
        nproc_per_node: processes on this node (one per GPU; any number on CPU).
        nnodes: number of nodes; with more than one, run this on every node with its
            ``node_rank`` and the same ``master_addr``/``master_port``.
        node_rank: this node's index.
        master_addr: host of node 0.
        master_port: rendezvous port on node 0; None picks a free one (single node only).
        max_restarts: how often the agent restarts failed workers.
        run_id: rendezvous id (default: a fresh one).
        start_method: multiprocessing start method of the workers.

    Returns:
        ``{rank: return value}`` of the local workers.
    """
    import uuid

    from torch.distributed.launcher.api import LaunchConfig, elastic_launch
    positive_int('nproc_per_node', nproc_per_node, 'a positive integer')
    if nnodes > 1 and master_port is None:
        raise ValueError(f'nnodes={nnodes} needs an explicit master_port shared by all nodes')
    store, state = None, snapshot()  # the caller's process as it was, after (the interfaces
    # pinned below, the variables torch's launcher sets)
    if nnodes == 1 and is_loopback(master_addr):  # listen on loopback only (see run_front)
        master_addr = '127.0.0.1' if master_addr == 'localhost' else master_addr
        try:
            store, master_port = loopback_store(master_addr, master_port or 0, rendezvous_timeout())
        except OSError:
            if master_port:
                check_port_free(master_port)  # names the process holding it
            raise
        note = pin_loopback_interfaces(os.environ)  # inherited by the workers
        if note:
            _log(note)
    port = master_port or find_free_port(master_addr)
    lc = LaunchConfig(min_nodes=nnodes, max_nodes=nnodes, nproc_per_node=nproc_per_node,
                      run_id=run_id or uuid.uuid4().hex[:8], rdzv_backend='static',
                      rdzv_endpoint=f'{master_addr}:{port}', rdzv_configs={
                          'rank': node_rank,
                          'timeout': rendezvous_timeout()
                      }, max_restarts=max_restarts, start_method=start_method, monitor_interval=0.5)
    try:
        return elastic_launch(lc, main_func)(list(argv))
    finally:
        del store
        restore(state)
