"""OpenMPI: ``mpirun -np N`` starts the processes. ``OMPI_COMM_WORLD_RANK``/``_SIZE``/
``_LOCAL_RANK``/``_LOCAL_SIZE`` give RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE; the node
is RANK // LOCAL_WORLD_SIZE. ``MASTER_ADDR`` is 127.0.0.1 on one host and must be passed on
several (``mpirun -x MASTER_ADDR=<host of rank 0>``: OpenMPI does not tell a process where rank
0 runs); the port is ``20000 + job id % 10000``. See docs/launching.md."""
from typing import Mapping, Optional

from ..variables import DistEnvError, copied, int_var, master_from

NAME = 'mpi'


def detect(environ: Mapping[str, str]) -> bool:
    """In a process of a multi-process ``mpirun``."""
    try:
        return int(environ.get('OMPI_COMM_WORLD_SIZE', '1')) > 1
    except ValueError:
        return False


def ask(environ: Mapping[str, str]) -> dict:
    return {}


def to_torch(environ: Mapping[str, str], asked: Mapping[str, str]) -> dict:
    """Map an OpenMPI process's variables onto torchrun's; ``MASTER_ADDR`` and
    ``MASTER_PORT`` set by the user win."""
    fix = ('start the processes with mpirun, e.g. mpirun -np 2 python tools/dist_train.py '
           'CONFIG --launcher mpi')
    out = copied(environ, (('OMPI_COMM_WORLD_RANK', 'RANK'), ('OMPI_COMM_WORLD_SIZE', 'WORLD_SIZE'),
                           ('OMPI_COMM_WORLD_LOCAL_RANK', 'LOCAL_RANK'),
                           ('OMPI_COMM_WORLD_LOCAL_SIZE', 'LOCAL_WORLD_SIZE')), NAME, fix)
    rank, world = int_var(out, 'RANK', fix), int_var(out, 'WORLD_SIZE', fix)
    local_size = int_var(out, 'LOCAL_WORLD_SIZE', fix)
    if local_size and world and world % local_size == 0:
        out['GROUP_RANK'] = str(rank // local_size)
        out['GROUP_WORLD_SIZE'] = str(world // local_size)
    if not environ.get('MASTER_ADDR') and local_size != world:
        raise DistEnvError(
            f'MASTER_ADDR is not set and the mpirun job spans several hosts '
            f'(OMPI_COMM_WORLD_SIZE={world}, OMPI_COMM_WORLD_LOCAL_SIZE={local_size}): pass the '
            'address of the host of rank 0 to every process, mpirun -x MASTER_ADDR=<host> ...')
    master_from(environ, out, '127.0.0.1', environ.get('OMPI_MCA_ess_base_jobid', ''))
    return out


def task_cpus(environ: Mapping[str, str]) -> Optional[int]:
    return None  # the host's cores, shared by its processes
