"""Read and validate the launcher's environment (pure: a mapping in, a frozen DistEnv out).

:func:`read_dist_env` reads torchrun's variables or maps Slurm's or OpenMPI's onto them
(:func:`slurm_to_torch`, :func:`mpi_to_torch`); every mistake raises :class:`DistEnvError`
with one line naming the variable, its value and the fix. See docs/launching.md: 'The
variables' (with a worked example), 'How a missing LOCAL_RANK is derived', and 'The five
ways', items 4 (Slurm's variables) and 6 (mpirun).
"""
import re
from dataclasses import dataclass, field
from typing import Mapping, Optional, Tuple

from ..errors import UserError

LOOPBACK = ('127.', 'localhost', '::1')


class DistEnvError(UserError, ValueError):
    """A launcher variable is missing, malformed or inconsistent (one line: what and fix)."""


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job.

    Attributes:
        launcher: 'none', 'pytorch', 'slurm' or 'mpi'.
        rank: global rank (0 .. world_size-1).
        local_rank: rank on this node; the GPU index the process uses.
        world_size: number of processes in the job.
        local_world_size: processes on this node.
        node_rank: index of this node (0 .. nnodes-1).
        nnodes: number of nodes.
        master_addr: host of rank 0 (None when not distributed).
        master_port: port of the rendezvous store on the master (None when not distributed).
        local_rank_source: where local_rank came from, for the launch log.
        under_torchrun: the process was started by torchrun / torch.distributed.elastic, which
            hosts the rendezvous store itself.
        warnings: things that look wrong but may be intended.
    """

    launcher: str = 'none'
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    nnodes: int = 1
    master_addr: Optional[str] = None
    master_port: Optional[int] = None
    local_rank_source: str = 'single process'
    under_torchrun: bool = False
    warnings: Tuple[str, ...] = field(default_factory=tuple)

    @property
    def distributed(self) -> bool:
        """Whether a process group is needed (any launcher but 'none')."""
        return self.launcher != 'none'

    def describe(self) -> str:
        """One line for the launch log."""
        if not self.distributed:
            return 'single process (launcher none): RANK 0, WORLD_SIZE 1'
        return (f'RANK {self.rank} of WORLD_SIZE {self.world_size} = node {self.node_rank} '
                f'(of {self.nnodes}) × {self.local_world_size} per node + LOCAL_RANK '
                f'{self.local_rank} [{self.local_rank_source}]; master '
                f'{self.master_addr}:{self.master_port}; launcher {self.launcher}')

    def as_environ(self) -> dict:
        """The torchrun-style variables MMEngine and torch read from ``os.environ``."""
        env = dict(RANK=self.rank, LOCAL_RANK=self.local_rank, WORLD_SIZE=self.world_size,
                   LOCAL_WORLD_SIZE=self.local_world_size, GROUP_RANK=self.node_rank)
        if self.master_addr is not None:
            env.update(MASTER_ADDR=self.master_addr, MASTER_PORT=self.master_port)
        return {k: str(v) for k, v in env.items()}


def _int(environ: Mapping[str, str], name: str, fix: str) -> Optional[int]:
    raw = environ.get(name)
    if raw is None or raw == '':
        return None
    try:
        return int(raw)
    except ValueError:
        raise DistEnvError(f'{name}={raw!r} is not an integer: {fix}') from None


def detect_launcher(environ: Mapping[str, str]) -> str:
    """'pytorch' when RANK or WORLD_SIZE is set; 'slurm' inside a multi-task ``srun`` step;
    'mpi' in a process of a multi-process ``mpirun``; else 'none'."""
    if 'RANK' in environ or 'WORLD_SIZE' in environ:
        return 'pytorch'
    try:
        if int(environ.get('SLURM_STEP_NUM_TASKS', '1')) > 1 and 'SLURM_PROCID' in environ:
            return 'slurm'
        if int(environ.get('OMPI_COMM_WORLD_SIZE', '1')) > 1:
            return 'mpi'
    except ValueError:
        pass
    return 'none'


def first_slurm_host(nodelist: str) -> str:
    """First host of a Slurm node list: ``'node[03-05,9],gpu1'`` → ``'node03'``."""
    depth, end = 0, len(nodelist)
    for i, ch in enumerate(nodelist):
        depth += {'[': 1, ']': -1}.get(ch, 0)
        if ch == ',' and depth == 0:
            end = i
            break
    first = nodelist[:end].strip()
    m = re.fullmatch(r'([^\[\]]*)\[([^\]]+)\](.*)', first)
    if m:
        start = re.split(r'[-,]', m.group(2))[0]
        first = f'{m.group(1)}{start}{m.group(3)}'
    if not first or '[' in first or ']' in first:
        raise DistEnvError(f'SLURM_NODELIST={nodelist!r} cannot be parsed: set MASTER_ADDR '
                           'to the host of rank 0')
    return first


JOB_PORT_BASE = 20000  # MASTER_PORT from a scheduler's job id: 20000 + id % 10000


def job_port(job_id: str) -> str:
    """``MASTER_PORT`` derived from a job id (Slurm's, mpirun's): two jobs sharing a host do
    not clash."""
    return str(JOB_PORT_BASE + int(job_id) % 10000)


def _copied(environ: Mapping[str, str], pairs, launcher: str, fix: str) -> dict:
    """``{torch's name: value}`` of a launcher's variables ``(its name, torch's name)``; a
    missing one raises with its name, the launcher and ``fix``."""
    out = {}
    for src, dst in pairs:
        if environ.get(src, '') == '':
            raise DistEnvError(f'{src} is not set, but --launcher {launcher} needs it: {fix}')
        out[dst] = environ[src]
    return out


def slurm_to_torch(environ: Mapping[str, str], master_addr: Optional[str] = None) -> dict:
    """Map a Slurm task's variables onto torchrun's (RANK, WORLD_SIZE, LOCAL_RANK, ...).

    Args:
        environ: the task's environment.
        master_addr: the address of the first node of the step, as Slurm reaches it
            (``NodeAddr``); None: that node's name. ``MASTER_ADDR`` in ``environ`` wins.
    """
    fix = 'run the command under srun, e.g. srun -N1 -n2 python tools/dist_train.py CONFIG ' \
          '--launcher slurm (or use tools/slurm_train.sh)'
    out = _copied(environ, (('SLURM_PROCID', 'RANK'), ('SLURM_NTASKS', 'WORLD_SIZE'),
                            ('SLURM_LOCALID', 'LOCAL_RANK')), 'slurm', fix)
    nnodes = environ.get('SLURM_NNODES') or environ.get('SLURM_JOB_NUM_NODES') or '1'
    world = _int(out, 'WORLD_SIZE', fix) or 1
    nn = _int({'SLURM_NNODES': nnodes}, 'SLURM_NNODES', fix) or 1
    out['GROUP_RANK'] = environ.get('SLURM_NODEID', '0')
    out['GROUP_WORLD_SIZE'] = str(nn)
    if world % nn == 0:
        out['LOCAL_WORLD_SIZE'] = str(world // nn)
    nodelist = environ.get('SLURM_STEP_NODELIST') or environ.get('SLURM_NODELIST')
    if environ.get('MASTER_ADDR'):
        out['MASTER_ADDR'] = environ['MASTER_ADDR']
    elif master_addr:
        out['MASTER_ADDR'] = master_addr
    elif nodelist:
        out['MASTER_ADDR'] = first_slurm_host(nodelist)
    if environ.get('MASTER_PORT'):
        out['MASTER_PORT'] = environ['MASTER_PORT']
    elif environ.get('SLURM_JOB_ID', '').isdigit():
        out['MASTER_PORT'] = job_port(environ['SLURM_JOB_ID'])
    return out


def mpi_to_torch(environ: Mapping[str, str]) -> dict:
    """Map an OpenMPI process's variables (``mpirun -np N``) onto torchrun's.

    ``OMPI_COMM_WORLD_RANK``/``_SIZE``/``_LOCAL_RANK``/``_LOCAL_SIZE`` give RANK, WORLD_SIZE,
    LOCAL_RANK and LOCAL_WORLD_SIZE, the node is RANK // LOCAL_WORLD_SIZE. ``MASTER_ADDR``
    set by you wins; on one node it is 127.0.0.1, on several it must be set (``mpirun -x
    MASTER_ADDR=<host of rank 0>``: OpenMPI does not tell a process where rank 0 runs).
    ``MASTER_PORT`` set by you wins, else ``20000 + job id % 10000`` (two jobs on one host do
    not clash).
    """
    fix = ('start the processes with mpirun, e.g. mpirun -np 2 python tools/dist_train.py '
           'CONFIG --launcher mpi')
    out = _copied(environ,
                  (('OMPI_COMM_WORLD_RANK', 'RANK'), ('OMPI_COMM_WORLD_SIZE', 'WORLD_SIZE'),
                   ('OMPI_COMM_WORLD_LOCAL_RANK', 'LOCAL_RANK'),
                   ('OMPI_COMM_WORLD_LOCAL_SIZE', 'LOCAL_WORLD_SIZE')), 'mpi', fix)
    rank, world = _int(out, 'RANK', fix), _int(out, 'WORLD_SIZE', fix)
    local_size = _int(out, 'LOCAL_WORLD_SIZE', fix)
    if local_size and world and world % local_size == 0:
        out['GROUP_RANK'] = str(rank // local_size)
        out['GROUP_WORLD_SIZE'] = str(world // local_size)
    if environ.get('MASTER_ADDR'):
        out['MASTER_ADDR'] = environ['MASTER_ADDR']
    elif local_size == world:
        out['MASTER_ADDR'] = '127.0.0.1'
    else:
        raise DistEnvError(
            f'MASTER_ADDR is not set and the mpirun job spans several hosts '
            f'(OMPI_COMM_WORLD_SIZE={world}, OMPI_COMM_WORLD_LOCAL_SIZE={local_size}): pass the '
            'address of the host of rank 0 to every process, mpirun -x MASTER_ADDR=<host> ...')
    if environ.get('MASTER_PORT'):
        out['MASTER_PORT'] = environ['MASTER_PORT']
    elif environ.get('OMPI_MCA_ess_base_jobid', '').isdigit():
        out['MASTER_PORT'] = job_port(environ['OMPI_MCA_ess_base_jobid'])
    return out


def _local_rank(env: Mapping[str, str], rank: int, world: int,
                num_gpus: int) -> Tuple[int, int, str]:
    """(local_rank, local_world_size, source) from LOCAL_RANK or derived from RANK."""
    fix = 'set it to the index of this process on its node (0 for the first)'
    local = _int(env, 'LOCAL_RANK', fix)
    lws = _int(env, 'LOCAL_WORLD_SIZE', 'set it to the number of processes on this node')
    if lws is not None and lws < 1:
        raise DistEnvError(f'LOCAL_WORLD_SIZE={lws} must be at least 1')
    if lws is not None and 0 < num_gpus < lws:  # every rank of the node says it, rank 0 too
        visible = env.get('CUDA_VISIBLE_DEVICES')
        raise DistEnvError(
            f'{lws} processes on this node (LOCAL_WORLD_SIZE={lws}) but {num_gpus} GPU(s) '
            f'visible (CUDA_VISIBLE_DEVICES={visible!r}): each process needs a GPU of its own. '
            f'Start at most {num_gpus} per node (bash tools/dist_train.sh CONFIG {num_gpus}), '
            f'make more GPUs visible, or run the {lws} processes on the CPU: '
            f'CUDA_VISIBLE_DEVICES= bash tools/dist_train.sh CONFIG {lws}')
    if local is not None:
        source = 'LOCAL_RANK'
    elif lws is not None:
        local, source = rank % lws, f'derived: RANK % LOCAL_WORLD_SIZE = {rank} % {lws}'
    elif num_gpus > 0:
        local, source = rank % num_gpus, f'derived: RANK % visible GPUs = {rank} % {num_gpus}'
        lws = num_gpus
    else:
        local, source = rank, 'derived: CPU, no device to pick, LOCAL_RANK = RANK'
    if lws is None:
        lws = world if num_gpus == 0 else max(num_gpus, local + 1)
    if local < 0 or local >= lws:
        raise DistEnvError(f'LOCAL_RANK={local} is out of range for LOCAL_WORLD_SIZE={lws}: '
                           f'local ranks on a node are 0..{lws - 1}')
    return local, lws, source


def read_dist_env(environ: Mapping[str, str], launcher: Optional[str] = None, num_gpus: int = 0,
                  slurm_master_addr: Optional[str] = None) -> DistEnv:
    """Validate the launcher variables and return where this process sits.

    Args:
        environ: usually ``os.environ``.
        launcher: 'none', 'pytorch', 'slurm' or 'mpi'; None detects it (:func:`detect_launcher`).
        num_gpus: GPUs visible to this process (``torch.cuda.device_count()``; 0 on CPU).
        slurm_master_addr: under Slurm, the address of the step's first node (see
            :func:`slurm_to_torch`).

    Raises:
        DistEnvError: one line naming the variable, its value and the fix.
    """
    launcher = launcher or detect_launcher(environ)
    if launcher == 'none':
        return DistEnv()
    if launcher not in ('pytorch', 'slurm', 'mpi'):
        raise DistEnvError(f'launcher={launcher!r} is not one of none, pytorch, slurm, mpi')
    env = dict(environ)
    if launcher == 'slurm':
        env.update(slurm_to_torch(environ, slurm_master_addr))
    elif launcher == 'mpi':
        env.update(mpi_to_torch(environ))
    return _read_torch_vars(env, launcher, num_gpus)


def _read_torch_vars(env: Mapping[str, str], launcher: str, num_gpus: int) -> DistEnv:
    rank = _int(env, 'RANK', 'set RANK to the global rank of this process (0 for the first)')
    world = _int(env, 'WORLD_SIZE', 'set WORLD_SIZE to the total number of processes')
    if rank is None and world is None:
        raise DistEnvError('--launcher pytorch, but RANK and WORLD_SIZE are not set: start with '
                           'torchrun --nproc_per_node=N tools/dist_train.py CONFIG, or set RANK, '
                           'WORLD_SIZE, MASTER_ADDR and MASTER_PORT for each process')
    if rank is None:
        raise DistEnvError(f'RANK is not set but WORLD_SIZE={world}: give each process its '
                           f'global rank (0..{max(world - 1, 0)}) in RANK, or launch with '
                           'torchrun, which sets it')
    if world is None:
        raise DistEnvError(f'WORLD_SIZE is not set but RANK={rank}: set WORLD_SIZE to the total '
                           'number of processes (nnodes × processes per node)')
    if world < 1:
        raise DistEnvError(f'WORLD_SIZE={world} must be at least 1')
    if not 0 <= rank < world:
        raise DistEnvError(f'RANK={rank} is out of range for WORLD_SIZE={world}: ranks are '
                           f'0..{world - 1}')
    local, lws, source = _local_rank(env, rank, world, num_gpus)
    if num_gpus > 0 and local >= num_gpus:
        raise DistEnvError(
            f'LOCAL_RANK={local} but only {num_gpus} GPU(s) are visible to this process '
            f'(CUDA_VISIBLE_DEVICES={env.get("CUDA_VISIBLE_DEVICES")!r}): start at most '
            f'{num_gpus} processes per node (--nproc_per_node={num_gpus}) or make more GPUs '
            'visible')
    node_rank = _int(env, 'GROUP_RANK', 'torchrun sets it to the node rank')
    if node_rank is None:
        node_rank = _int(env, 'NODE_RANK', 'set NODE_RANK to the index of this node')
    if node_rank is None:
        node_rank = rank // lws
    nnodes = _int(env, 'GROUP_WORLD_SIZE', 'torchrun sets it to the number of nodes')
    if nnodes is None:
        nnodes = _int(env, 'NNODES', 'set NNODES to the number of nodes')
    if nnodes is None:
        nnodes = max(1, -(-world // lws))
    addr, port = _master(env)
    warnings = []
    if nnodes > 1 and addr.startswith(LOOPBACK):
        warnings.append(f'MASTER_ADDR={addr} is a loopback address but the job has {nnodes} '
                        'nodes: other hosts cannot reach it. Set MASTER_ADDR to the address '
                        'of the host of rank 0 (fine only if all "nodes" are this machine)')
    return DistEnv(launcher=launcher, rank=rank, local_rank=local, world_size=world,
                   local_world_size=lws, node_rank=node_rank, nnodes=nnodes, master_addr=addr,
                   master_port=port, local_rank_source=source, under_torchrun='TORCHELASTIC_RUN_ID'
                   in env, warnings=tuple(warnings))


def _master(env: Mapping[str, str]) -> Tuple[str, int]:
    addr = env.get('MASTER_ADDR', '')
    if not addr:
        raise DistEnvError('MASTER_ADDR is not set: set it to the address of the host of rank 0 '
                           '(127.0.0.1 when all processes run on this machine)')
    raw = env.get('MASTER_PORT', '')
    if not raw:
        raise DistEnvError('MASTER_PORT is not set: choose a free TCP port on the host of '
                           'rank 0, the same for every process, e.g. MASTER_PORT=29500')
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise DistEnvError(f'MASTER_PORT={raw!r} is not a TCP port number (1-65535): e.g. '
                           'MASTER_PORT=29500')
    return addr, int(raw)


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


# set by dist_train.sh's torchrun front where the user's environment has no OMP_NUM_THREADS:
# torchrun then sets 1 for its workers, which is no choice of the user's
OMP_UNSET_ENV = 'MMDDP_OMP_UNSET'


def threads_per_process(environ: Mapping[str, str], local_world_size: int, cpu_count: Optional[int],
                        workers: int = 0, launcher: str = 'pytorch') -> Optional[int]:
    """Intra-op threads for each of ``local_world_size`` processes on a host with ``cpu_count``
    cores and ``workers`` busy DataLoader workers per process, or None when the user chose
    (``OMP_NUM_THREADS`` set and not empty, and not torchrun's default: :data:`OMP_UNSET_ENV`).

    Processes started by hand or by :func:`mmddp_ext.launch` would otherwise each start one thread
    per core and oversubscribe the cores; torchrun sets ``OMP_NUM_THREADS=1`` for several processes
    per node, which leaves cores idle on a larger node. The cores are shared, and each worker takes
    one: ``cpu_count // local_world_size - workers``, at least 1. A rank that srun started as a task
    of its own (``launcher='slurm'``) has its task's CPUs instead, where Slurm says how many
    (``SLURM_CPUS_PER_TASK``, ``--cpus-per-task``; tools/slurm_train.sh asks 5):
    ``min(cpu_count, SLURM_CPUS_PER_TASK) - workers``.

    >>> threads_per_process({}, 2, 16), threads_per_process({}, 2, 16, workers=2)
    (8, 6)
    >>> threads_per_process({'OMP_NUM_THREADS': '4'}, 2, 16)  # the user's
    >>> threads_per_process({'OMP_NUM_THREADS': '1', OMP_UNSET_ENV: '1'}, 2, 16)  # torchrun's
    8
    >>> threads_per_process({'SLURM_CPUS_PER_TASK': '5'}, 8, 64, workers=2, launcher='slurm')
    3
    """
    if environ.get('OMP_NUM_THREADS') and environ.get(OMP_UNSET_ENV) != '1':
        return None
    task = environ.get('SLURM_CPUS_PER_TASK', '')
    if launcher == 'slurm' and task.isdigit() and int(task) > 0:  # the task's own CPUs
        share = min(int(task), cpu_count or int(task))
    else:
        share = (cpu_count or 1) // max(1, local_world_size)
    return max(1, share - max(0, workers))
