"""``launch_workers``: the elastic agent running a given function on N local processes
(``mmddp_ext.launch`` hands it the training entry), as torchrun would."""
import os
import uuid
from typing import Any, Callable, Optional, Sequence

from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from mmddp_launch.rendezvous import find_free_port, is_loopback
from mmddp_launch.rendezvous import log as _log
from mmddp_launch.rendezvous import loopback_store, pin_loopback_interfaces

from ..utils.checks import positive_int
from ..utils.process_state import restore, snapshot
from .store import check_port_free, rendezvous_timeout


def launch_workers(main_func: Callable[..., Any], argv: Sequence[str] = (), nproc_per_node: int = 1,
                   nnodes: int = 1, node_rank: int = 0, master_addr: str = '127.0.0.1',
                   master_port: Optional[int] = None, max_restarts: int = 0,
                   run_id: Optional[str] = None, start_method: str = 'spawn') -> dict:
    """Run ``main_func(list(argv))`` in ``nproc_per_node`` local processes under
    torch.distributed.elastic (the agent starts, watches and restarts them), as torchrun
    would: the launcher is handed the function to run; it never imports the training entry.

    A single node on a loopback ``master_addr`` gets its store on that address only and
    gloo/NCCL pinned to the loopback interface (see :mod:`mmddp_ext.launcher.torchrun_front`).

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

    positive_int('nproc_per_node', nproc_per_node, 'a positive integer')
    if nnodes > 1 and master_port is None:
        raise ValueError(f'nnodes={nnodes} needs an explicit master_port shared by all nodes')
    store, state = None, snapshot()  # the caller's process as it was, after (the interfaces
    # pinned below, the variables torch's launcher sets)
    if nnodes == 1 and is_loopback(master_addr):  # listen on loopback only (see torchrun_front)
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
