"""Reading a launcher's variables: the one error type (one line: the variable, its value, the
fix) and the helpers every way of starting a job (:mod:`.ways`) reads its variables with."""
from typing import Mapping, Optional, Sequence, Tuple

from ..errors import UserError


class DistEnvError(UserError, ValueError):
    """A launcher variable is missing, malformed or inconsistent (one line: what and fix)."""


def int_var(environ: Mapping[str, str], name: str, fix: str) -> Optional[int]:
    """``environ[name]`` as an integer; None where unset or empty; else one line with ``fix``."""
    raw = environ.get(name)
    if raw is None or raw == '':
        return None
    try:
        return int(raw)
    except ValueError:
        raise DistEnvError(f'{name}={raw!r} is not an integer: {fix}') from None


def copied(environ: Mapping[str, str], pairs: Sequence[Tuple[str, str]], launcher: str,
           fix: str) -> dict:
    """``{torch's name: value}`` of a launcher's variables ``(its name, torch's name)``; a
    missing one raises with its name, the launcher and ``fix``."""
    out = {}
    for src, dst in pairs:
        if environ.get(src, '') == '':
            raise DistEnvError(f'{src} is not set, but --launcher {launcher} needs it: {fix}')
        out[dst] = environ[src]
    return out


JOB_PORT_BASE = 20000  # MASTER_PORT from a scheduler's job id: 20000 + id % 10000


def job_port(job_id: str) -> str:
    """``MASTER_PORT`` derived from a job id (Slurm's, mpirun's): two jobs sharing a host do
    not clash."""
    return str(JOB_PORT_BASE + int(job_id) % 10000)


def master_from(environ: Mapping[str, str], out: dict, addr: Optional[str], job_id: str) -> None:
    """Into ``out``: ``MASTER_ADDR`` and ``MASTER_PORT`` set by the user (they win), else
    ``addr`` (when given) and the port of ``job_id`` (when it is a number)."""
    if environ.get('MASTER_ADDR'):
        out['MASTER_ADDR'] = environ['MASTER_ADDR']
    elif addr:
        out['MASTER_ADDR'] = addr
    if environ.get('MASTER_PORT'):
        out['MASTER_PORT'] = environ['MASTER_PORT']
    elif job_id.isdigit():
        out['MASTER_PORT'] = job_port(job_id)
