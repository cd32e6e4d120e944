"""Read and validate the launcher's environment (pure: a mapping in, a frozen DistEnv out).

:func:`read_dist_env` reads torch's variables, which each way of starting a job
(:mod:`.ways`) maps its own onto; every mistake raises :class:`DistEnvError` with one line
naming the variable, its value and the fix. See docs/launching.md: 'The variables' and 'The
six ways'.
"""
import dataclasses
from dataclasses import dataclass, field
from typing import Mapping, Optional, Tuple

from . import ways
from .variables import DistEnvError, int_var

LOOPBACK = ('127.', 'localhost', '::1')


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
        task_cpus: the CPUs the scheduler gave this process (Slurm's ``--cpus-per-task``);
            None: the node's cores, shared by its ranks.
        task_cpus_of: what gave them, for the log ('its Slurm task').
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
    task_cpus: Optional[int] = None
    task_cpus_of: str = ''
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


def detect_launcher(environ: Mapping[str, str]) -> str:
    """The ``launcher`` of the first way whose variables ``environ`` holds (:mod:`.ways`, in
    their order), else 'none'."""
    way = ways.detect(environ)
    return way.NAME if way is not None else 'none'


def _local_rank(env: Mapping[str, str], rank: int, world: int,
                num_gpus: int) -> Tuple[int, int, str]:
    """(local_rank, local_world_size, source) from LOCAL_RANK or derived from RANK."""
    fix = 'set it to the index of this process on its node (0 for the first)'
    local = int_var(env, 'LOCAL_RANK', fix)
    lws = int_var(env, 'LOCAL_WORLD_SIZE', 'set it to the number of processes on this node')
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
                  asked: Optional[Mapping[str, str]] = None) -> DistEnv:
    """Validate the launcher variables and return where this process sits.

    Args:
        environ: usually ``os.environ``.
        launcher: 'none' or a way's ``NAME`` ('pytorch', 'slurm', 'mpi'); None detects it
            (:func:`detect_launcher`).
        num_gpus: GPUs visible to this process (``torch.cuda.device_count()``; 0 on CPU).
        asked: what the way's scheduler said (its ``ask``: under Slurm the address of the
            step's first node); None: nothing asked.

    Raises:
        DistEnvError: one line naming the variable, its value and the fix.
    """
    launcher = launcher or detect_launcher(environ)
    if launcher == 'none':
        return DistEnv()
    try:
        way = ways.named(launcher, environ)
    except KeyError:
        raise DistEnvError(
            f'launcher={launcher!r} is not one of {", ".join(ways.names())}') from None
    env = dict(environ)
    env.update(way.to_torch(environ, asked or {}))
    cpus = way.task_cpus(environ)
    env_read = _read_torch_vars(env, launcher, num_gpus)
    if cpus is None:
        return env_read
    return dataclasses.replace(env_read, task_cpus=cpus, task_cpus_of=way.TASK_CPUS_OF)


def _read_torch_vars(env: Mapping[str, str], launcher: str, num_gpus: int) -> DistEnv:
    rank = int_var(env, 'RANK', 'set RANK to the global rank of this process (0 for the first)')
    world = int_var(env, 'WORLD_SIZE', 'set WORLD_SIZE to the total number of processes')
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
    node_rank = int_var(env, 'GROUP_RANK', 'torchrun sets it to the node rank')
    if node_rank is None:
        node_rank = int_var(env, 'NODE_RANK', 'set NODE_RANK to the index of this node')
    if node_rank is None:
        node_rank = rank // lws
    nnodes = int_var(env, 'GROUP_WORLD_SIZE', 'torchrun sets it to the number of nodes')
    if nnodes is None:
        nnodes = int_var(env, 'NNODES', 'set NNODES to the number of nodes')
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
