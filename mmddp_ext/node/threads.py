"""How many intra-op threads each rank computes with where the user chose none (pure).

Processes started by hand or by :func:`mmddp_ext.launch` would otherwise each start one thread
per core and oversubscribe the cores; torchrun sets ``OMP_NUM_THREADS=1`` for several processes
per node, which leaves cores idle on a larger node.
"""
from typing import Mapping, Optional

from mmddp_launch.shared import OMP_UNSET_ENV


def threads_per_process(environ: Mapping[str, str], local_world_size: int, cpu_count: Optional[int],
                        workers: int = 0, task_cpus: Optional[int] = None) -> Optional[int]:
    """Intra-op threads for each of ``local_world_size`` processes on a host with ``cpu_count``
    cores and ``workers`` busy DataLoader workers per process, or None when the user chose
    (``OMP_NUM_THREADS`` set and not empty, and not torchrun's default: :data:`OMP_UNSET_ENV`).

    The cores are shared, and each worker takes one: ``cpu_count // local_world_size -
    workers``, at least 1. A process its scheduler gave CPUs of its own (``task_cpus``: a
    Slurm task's ``--cpus-per-task``; tools/slurm_train.sh asks 5) has those instead:
    ``min(cpu_count, task_cpus) - workers``.

    >>> threads_per_process({}, 2, 16), threads_per_process({}, 2, 16, workers=2)
    (8, 6)
    >>> threads_per_process({'OMP_NUM_THREADS': '4'}, 2, 16)  # the user's
    >>> threads_per_process({'OMP_NUM_THREADS': '1', OMP_UNSET_ENV: '1'}, 2, 16)  # torchrun's
    8
    >>> threads_per_process({}, 8, 64, workers=2, task_cpus=5)
    3
    """
    if environ.get('OMP_NUM_THREADS') and environ.get(OMP_UNSET_ENV) != '1':
        return None
    if task_cpus:  # the process's own CPUs
        share = min(task_cpus, cpu_count or task_cpus)
    else:
        share = (cpu_count or 1) // max(1, local_world_size)
    return max(1, share - max(0, workers))
