"""Slurm: ``srun`` starts one task per rank (``sbatch`` scripts and ``tools/slurm_train.sh``
run srun). Its variables map onto torch's (``SLURM_PROCID`` → ``RANK``, ``SLURM_NTASKS`` →
``WORLD_SIZE``, ``SLURM_LOCALID`` → ``LOCAL_RANK``, ``SLURM_NODEID`` → node rank); the port is
``20000 + SLURM_JOB_ID % 10000``; the CPUs of a task are ``SLURM_CPUS_PER_TASK``.

What only Slurm knows is asked through its own tools (``scontrol``): node names need not resolve
through DNS on a Slurm cluster (Slurm reaches its nodes by the ``NodeAddr`` of ``slurm.conf``),
so ``MASTER_ADDR`` is the first node's ``NodeAddr`` (``scontrol show hostnames``, then
``scontrol show node -o NAME``), or its name where ``scontrol`` says nothing; and the requeue
(``scontrol requeue $SLURM_JOB_ID``) of a job stopped by a signal
(:class:`~mmddp_ext.hooks.PreemptionHook`). See docs/launching.md.
"""
import os
import re
import subprocess
from typing import List, Mapping, Optional, Tuple

from ..variables import DistEnvError, copied, int_var, master_from

NAME = 'slurm'
TASK_CPUS_OF = 'its Slurm task'  # for the log's thread count


def detect(environ: Mapping[str, str]) -> bool:
    """Inside a multi-task ``srun`` step (a batch script itself, or ``srun -n1``, is one
    process)."""
    try:
        return int(environ.get('SLURM_STEP_NUM_TASKS', '1')) > 1 and 'SLURM_PROCID' in environ
    except ValueError:
        return False


def ask(environ: Mapping[str, str]) -> dict:
    """``{'master_addr': the step's first node as Slurm reaches it}`` where scontrol says."""
    addr = master_addr(environ)
    return {'master_addr': addr} if addr else {}


def to_torch(environ: Mapping[str, str], asked: Mapping[str, str]) -> dict:
    """Map a Slurm task's variables onto torchrun's (RANK, WORLD_SIZE, LOCAL_RANK, ...).

    Args:
        environ: the task's environment.
        asked: :func:`ask`'s answer: ``master_addr``, the address of the first node of the
            step (its ``NodeAddr``); absent: that node's name. ``MASTER_ADDR`` in ``environ``
            wins.
    """
    fix = 'run the command under srun, e.g. srun -N1 -n2 python tools/dist_train.py CONFIG ' \
          '--launcher slurm (or use tools/slurm_train.sh)'
    out = copied(environ, (('SLURM_PROCID', 'RANK'), ('SLURM_NTASKS', 'WORLD_SIZE'),
                           ('SLURM_LOCALID', 'LOCAL_RANK')), NAME, fix)
    nnodes = environ.get('SLURM_NNODES') or environ.get('SLURM_JOB_NUM_NODES') or '1'
    world = int_var(out, 'WORLD_SIZE', fix) or 1
    nn = int_var({'SLURM_NNODES': nnodes}, 'SLURM_NNODES', fix) or 1
    out['GROUP_RANK'] = environ.get('SLURM_NODEID', '0')
    out['GROUP_WORLD_SIZE'] = str(nn)
    if world % nn == 0:
        out['LOCAL_WORLD_SIZE'] = str(world // nn)
    nodelist = environ.get('SLURM_STEP_NODELIST') or environ.get('SLURM_NODELIST')
    addr = None
    if not environ.get('MASTER_ADDR'):  # the user's wins; else the one Slurm reaches
        addr = asked.get('master_addr') or (first_host(nodelist) if nodelist else None)
    master_from(environ, out, addr, environ.get('SLURM_JOB_ID', ''))
    return out


def task_cpus(environ: Mapping[str, str]) -> Optional[int]:
    """The CPUs Slurm gave this task (``--cpus-per-task``), where it says."""
    task = environ.get('SLURM_CPUS_PER_TASK', '')
    return int(task) if task.isdigit() and int(task) > 0 else None


def first_host(nodelist: str) -> str:
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


SCONTROL_TIMEOUT = 30.0  # seconds; slurmctld answers in milliseconds when it is up


def _scontrol(*args: str) -> Optional[str]:
    """``scontrol ARGS`` output, or None when scontrol is missing or fails."""
    try:
        proc = subprocess.run(['scontrol', *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, timeout=SCONTROL_TIMEOUT)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _fields(line: str) -> dict:
    """``Key=Value`` pairs of one ``scontrol show ... -o`` line (values without spaces)."""
    return dict(part.split('=', 1) for part in line.split() if '=' in part)


def hostnames(nodelist: str) -> List[str]:
    """The node names of a Slurm node list (``n[1-2]`` → ``['n1', 'n2']``), by
    ``scontrol show hostnames``; empty when scontrol cannot say."""
    out = _scontrol('show', 'hostnames', nodelist)
    return out.split() if out else []


def node_addr(node: str) -> Optional[str]:
    """The ``NodeAddr`` Slurm reaches ``node`` by (``scontrol show node -o NODE``), or None."""
    out = _scontrol('show', 'node', '-o', node)
    if not out:
        return None
    addr = _fields(out.strip().splitlines()[0]).get('NodeAddr')
    return addr or None


def master_addr(environ: Mapping[str, str]) -> Optional[str]:
    """The address of the first node of this Slurm step, for ``MASTER_ADDR``; None when the
    environment sets ``MASTER_ADDR`` itself, is not a Slurm task, or scontrol cannot say."""
    if environ.get('MASTER_ADDR'):
        return None
    nodelist = environ.get('SLURM_STEP_NODELIST') or environ.get('SLURM_NODELIST')
    if not nodelist:
        return None
    names = hostnames(nodelist)
    return node_addr(names[0]) if names else None


def job_requeue_state(job_id: str) -> Tuple[bool, bool]:
    """``(batch job, requeue allowed)`` of a Slurm job (``scontrol show job -o``): a batch job
    submitted with ``--requeue`` (or under ``JobRequeue=1``) may be put back in the queue."""
    out = _scontrol('show', 'job', '-o', job_id)
    if not out:
        return False, False
    fields = _fields(out.strip().splitlines()[0])
    return fields.get('BatchFlag') == '1', fields.get('Requeue') == '1'


def requeue(environ: Mapping[str, str]) -> Optional[Tuple[bool, str]]:
    """:func:`requeue_job` for a Slurm job (``SLURM_JOB_ID``); None for any other process."""
    return requeue_job(environ) if environ.get('SLURM_JOB_ID') else None


def requeue_job(environ: Mapping[str, str] = os.environ) -> Tuple[bool, str]:
    """Put this Slurm job back in the queue when it may be: ``(requeued, what was done)``.

    Call it as the last thing a stopped job does: Slurm ends the job's processes at once.
    """
    job = environ.get('SLURM_JOB_ID', '')
    if not job:
        return False, 'not a Slurm job'
    batch, allowed = job_requeue_state(job)
    if not batch:
        return False, f'Slurm job {job} is not a batch job (sbatch), so it is not requeued'
    if not allowed:
        return False, (f'Slurm job {job} was submitted without --requeue, so it is not requeued '
                       '(sbatch --requeue makes it continue by itself)')
    try:
        proc = subprocess.run(['scontrol', 'requeue', job], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=SCONTROL_TIMEOUT)
    except (OSError, subprocess.SubprocessError) as e:
        return False, f'scontrol requeue {job} failed: {e}'
    if proc.returncode != 0:
        return False, f'scontrol requeue {job} failed: {proc.stdout.strip()}'
    return True, f'requeued Slurm job {job}: it resumes from this checkpoint when it starts again'
