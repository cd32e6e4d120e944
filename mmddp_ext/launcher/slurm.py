"""What only Slurm knows, asked through its own tools (``scontrol``): the address of rank 0's
node, whether a job may be requeued, and the requeue itself.

Node names need not resolve through DNS on a Slurm cluster (Slurm reaches its nodes by the
``NodeAddr`` of ``slurm.conf``), so ``MASTER_ADDR`` under ``--launcher slurm`` is the first
node's ``NodeAddr`` (``scontrol show hostnames``, then ``scontrol show node -o NAME``), or its
name where ``scontrol`` says nothing. :func:`mmddp_ext.launcher.env.slurm_to_torch` receives it
as an argument and stays pure. The requeue (``scontrol requeue $SLURM_JOB_ID``) is for a job
stopped by a signal (:class:`~mmddp_ext.hooks.PreemptionHook`); see docs/launching.md.
"""
import os
import subprocess
from typing import List, Mapping, Optional, Tuple

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
