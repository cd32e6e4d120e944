"""Process-group set-up and tear-down, and ``launch()`` on torch.distributed.elastic.

MMEngine's ``init_dist('pytorch')`` always calls ``torch.cuda.set_device`` (it fails on a CPU
host) and waits up to 30 minutes for a missing rank. We initialise the process group before
the Runner is built (``Runner.setup_env`` then skips its own ``init_dist``):

* the CUDA device is pinned to LOCAL_RANK first, so no CUDA context lands on GPU 0 by accident;
* under torchrun the agent's store is used (``env://``);
* started by hand (or by Slurm) we open the TCP store ourselves with a bounded rendezvous
  timeout: a port already in use, an unreachable master, or fewer processes than WORLD_SIZE
  each end with one line that names MASTER_ADDR/MASTER_PORT/WORLD_SIZE and the fix.
"""
import errno
import os
import socket
import time
from datetime import timedelta
from typing import Optional, Sequence, Tuple, Union

from .env import DistEnv, DistEnvError, choose_backend

RENDEZVOUS_TIMEOUT_ENV = 'MMDDP_RENDEZVOUS_TIMEOUT'
DEFAULT_RENDEZVOUS_TIMEOUT = 300.0


def rendezvous_timeout() -> float:
    """Seconds to wait for all ranks to meet (env ``MMDDP_RENDEZVOUS_TIMEOUT``, default 300)."""
    raw = os.environ.get(RENDEZVOUS_TIMEOUT_ENV, str(DEFAULT_RENDEZVOUS_TIMEOUT))
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise DistEnvError(f'{RENDEZVOUS_TIMEOUT_ENV}={raw!r} must be a positive number of '
                           'seconds, e.g. 300')
    return value


def pin_device(local_rank: int) -> Optional[int]:
    """``torch.cuda.set_device(local_rank)`` when CUDA is available; returns the device index."""
    import torch
    if not torch.cuda.is_available():
        return None
    torch.cuda.set_device(local_rank)
    return local_rank


def check_port_free(port: int) -> None:
    """Raise DistEnvError when ``port`` is already bound on this host (rank 0 only)."""
    for family, addr in ((socket.AF_INET, '0.0.0.0'), (socket.AF_INET6, '::')):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue
        try:
            sock.bind((addr, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise DistEnvError(
                    f'MASTER_PORT={port} is already in use on this host (another job?): '
                    'choose a free port for every process, e.g. MASTER_PORT='
                    f'{find_free_port()}') from None
        finally:
            sock.close()


def find_free_port(host: str = '127.0.0.1') -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _rendezvous(env: DistEnv, timeout: float):
    """Open the TCP store (rank 0 hosts it) and wait until all ranks have joined."""
    import torch.distributed as dist
    where = f'MASTER_ADDR={env.master_addr} MASTER_PORT={env.master_port}'
    if env.rank == 0:
        check_port_free(env.master_port)
    try:
        store = dist.TCPStore(env.master_addr, env.master_port, env.world_size,
                              is_master=env.rank == 0, timeout=timedelta(seconds=timeout),
                              wait_for_workers=False)
    except Exception as e:  # DistNetworkError / RuntimeError, depending on torch
        if env.rank == 0:
            raise DistEnvError(f'rank 0 could not open the rendezvous store at {where}: '
                               f'{str(e).splitlines()[0]}') from e
        raise DistEnvError(
            f'rank {env.rank} could not reach the rank-0 store at {where} within {timeout:.0f} '
            's: check that rank 0 is running, that MASTER_ADDR is its host and that the port '
            f'is open ({RENDEZVOUS_TIMEOUT_ENV} sets the wait)') from e
    deadline = time.monotonic() + timeout
    try:
        joined = store.add('mmddp_ext/joined', 1)
        while joined < env.world_size:
            if time.monotonic() > deadline:
                raise DistEnvError(
                    f'only {joined} of WORLD_SIZE={env.world_size} processes joined at {where} '
                    f'within {timeout:.0f} s: start the missing ranks, or set WORLD_SIZE to the '
                    'number of processes you start')
            time.sleep(0.05)
            joined = store.add('mmddp_ext/joined', 0)
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

    Args:
        env: from :func:`mmddp_ext.dist.env.read_dist_env`.
        backend: requested backend (``env_cfg.dist_cfg.backend``); None picks nccl/gloo.
        timeout: collective timeout in seconds (default: torch's 30 minutes).

    Returns:
        (backend used, warning or None).
    """
    import torch
    import torch.distributed as dist
    os.environ.update(env.as_environ())  # MMEngine and samplers read these
    pin_device(env.local_rank)
    backend, warning = choose_backend(backend, torch.cuda.is_available())
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


def launch(config: Union[str, 'object'], nproc_per_node: int = 1, nnodes: int = 1,
           node_rank: int = 0, master_addr: str = '127.0.0.1', master_port: Optional[int] = None,
           args: Sequence[str] = (), max_restarts: int = 0, run_id: Optional[str] = None,
           start_method: str = 'spawn') -> dict:
    """Train ``config`` on ``nproc_per_node`` local processes with torch.distributed.elastic.

    The programmatic twin of ``torchrun --nproc_per_node=N tools/dist_train.py CONFIG ARGS``:
    the elastic agent starts, watches and (with ``max_restarts``) restarts the workers.

    Args:
        config: a config path, ``pkg::path``, or an ``mmengine.Config`` (dumped to a
            temporary file first).
        nproc_per_node: processes on this node (one per GPU; any number on CPU).
        nnodes: number of nodes; with more than one, run this on every node with its
            ``node_rank`` and the same ``master_addr``/``master_port``.
        node_rank: this node's index.
        master_addr: host of node 0.
        master_port: rendezvous port on node 0; None picks a free one (single node only).
        args: further ``dist_train.py`` arguments, e.g. ``['--work-dir', 'w']``.
        max_restarts: how often the agent restarts failed workers.
        run_id: rendezvous id (default: a fresh one).
        start_method: multiprocessing start method of the workers.

    Returns:
        ``{rank: return value}`` of the local workers (0 on success).

    Example::

        >>> import mmddp_ext
        >>> mmddp_ext.launch('configs/demo/td-hm_res18_1xb32-30e_demo-64x64.py',
        ...                  nproc_per_node=2, args=['--work-dir', 'work_dirs/demo'])
    """
    import uuid

    from torch.distributed.launcher.api import LaunchConfig, elastic_launch
    if not isinstance(nproc_per_node, int) or nproc_per_node < 1:
        raise ValueError(f'nproc_per_node={nproc_per_node!r} must be a positive integer')
    if nnodes > 1 and master_port is None:
        raise ValueError(f'nnodes={nnodes} needs an explicit master_port shared by all nodes')
    config_path = _config_path(config)
    port = master_port or find_free_port(master_addr)
    lc = LaunchConfig(min_nodes=nnodes, max_nodes=nnodes, nproc_per_node=nproc_per_node,
                      run_id=run_id or uuid.uuid4().hex[:8], rdzv_backend='static',
                      rdzv_endpoint=f'{master_addr}:{port}',
                      rdzv_configs={'rank': node_rank, 'timeout': rendezvous_timeout()},
                      max_restarts=max_restarts, start_method=start_method,
                      monitor_interval=0.5)
    from ..train import main
    return elastic_launch(lc, main)([config_path, *args])


def _config_path(config) -> str:
    if isinstance(config, str):
        return config
    import tempfile
    tmp = tempfile.NamedTemporaryFile('w', suffix='.py', prefix='mmddp_launch_', delete=False)
    tmp.close()
    config.dump(tmp.name)
    return tmp.name
