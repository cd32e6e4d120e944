"""This process's place in the job, read once from the launcher's environment:
:func:`read_launch_env` (the pure rules: :mod:`.env`; each way's own: :mod:`.ways`).

Every part of a rank that needs its layout (the entry, the runner built from another entry
point, the process group's start) asks this one reader; a process reads its own environment
once, and a later call with the environment unchanged gets the same reading (Slurm is asked
for the master's address once).
"""
import os
from typing import Dict, Mapping, Optional, Tuple

from ..gpu import gpus
from . import ways
from .env import DistEnv, detect_launcher, read_dist_env

# the reading of this process's own environment: {(launcher, GPUs, environment): DistEnv}
_READ: Dict[Tuple, DistEnv] = {}


def read_launch_env(launcher: Optional[str] = None, num_gpus: Optional[int] = None,
                    environ: Optional[Mapping[str, str]] = None) -> DistEnv:
    """:func:`~mmddp_ext.launcher.env.read_dist_env` of ``environ`` (default ``os.environ``) with
    ``num_gpus`` (default: the GPUs visible to this process), the one rule for this rank's
    layout (a missing ``LOCAL_RANK`` is derived from the GPU count), with what the way's
    scheduler says (its ``ask``: under Slurm the ``NodeAddr`` of the step's first node, which
    every node reaches).

    The process's own environment is read once: the reading is kept while the launcher, the
    GPU count and every variable stay as they were. An ``environ`` given is read each time.
    """
    own = environ is None
    environ = os.environ if own else environ
    num_gpus = gpus().count() if num_gpus is None else num_gpus
    launcher = launcher or detect_launcher(environ)
    key = (launcher, num_gpus, tuple(sorted(environ.items()))) if own else None
    if key is not None and key in _READ:
        return _READ[key]
    try:
        asked = ways.named(launcher, environ).ask(environ) if launcher != 'none' else {}
    except KeyError:  # an unknown launcher: read_dist_env names it
        asked = {}
    env = read_dist_env(environ, launcher, num_gpus, asked)
    if key is not None:
        _READ.clear()  # one reading kept: the latest
        _READ[key] = env
    return env
