"""Kubeflow's PyTorchJob (and job operators like it): each pod is a node and runs
``dist_train.sh`` with its own GPU count; the operator gives every pod torchrun's
``PET_NNODES`` and ``PET_NODE_RANK``, ``MASTER_ADDR``/``MASTER_PORT``, and its own
``WORLD_SIZE`` (pods, or pods × processes per pod) and ``RANK`` (the pod's index).

Read by ``dist_train.sh``'s front (:mod:`mmddp_ext.launcher.torchrun_front`), before torchrun
starts the ranks, whose own variables are then torchrun's (:mod:`.torchrun`). Standard library
only: the front runs without the package's imports.
"""
from typing import Mapping, Optional, Tuple

FIX = ('run dist_train.sh on every pod with NNODES=<number of pods> and NODE_RANK=<this '
       "pod's index> (PyTorchJob's PET_NNODES and PET_NODE_RANK are read when set), or unset "
       'WORLD_SIZE and RANK')


def node_layout(environ: Mapping[str, str], nnodes: str, node_rank: str,
                port: str) -> Tuple[str, str, str, Optional[str]]:
    """The front's ``NNODES``, ``NODE_RANK`` and ``PORT`` (strings, '' where unset) completed
    from the operator's variables where the user set none: ``PET_NNODES`` and ``PET_NODE_RANK``
    (when ``NNODES`` is unset), and, for several nodes, ``MASTER_PORT`` (when ``PORT`` is
    unset: the nodes meet where the operator says). Returns them and a line saying what was
    read, or None."""
    note = None
    if not nnodes and environ.get('PET_NNODES'):
        nnodes = environ['PET_NNODES']
        node_rank = node_rank or environ.get('PET_NODE_RANK', '') or '0'
        note = (f'NNODES={nnodes} NODE_RANK={node_rank} from PET_NNODES/PET_NODE_RANK (the '
                "job's operator, e.g. Kubeflow's PyTorchJob, set them)")
    if nnodes not in ('', '1') and not port and environ.get('MASTER_PORT'):
        port = environ['MASTER_PORT']
    return nnodes, node_rank, port, note


def layout_error(environ: Mapping[str, str], nnodes: int, node_rank: int,
                 nproc: int) -> Optional[str]:
    """The operator's ``WORLD_SIZE``/``RANK`` in the front's environment that contradict the
    layout this node starts: the one line that says so, or None."""
    world, rank = environ.get('WORLD_SIZE', ''), environ.get('RANK', '')
    if not world.isdigit():
        return None
    if int(world) not in (nnodes, nnodes * nproc):
        return (f'WORLD_SIZE={world} is set in this environment (a job operator sets it, e.g. '
                "Kubeflow's PyTorchJob: the number of pods, or pods × processes per pod), but "
                f'this job has NNODES={nnodes} × {nproc} processes per node: {FIX}')
    if int(world) == nnodes and rank.isdigit() and int(rank) != node_rank:
        return (f"RANK={rank} is set in this environment (a job operator's index of this pod) "
                f'but NODE_RANK={node_rank}: {FIX}')
    return None
