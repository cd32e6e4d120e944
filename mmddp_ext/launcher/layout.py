"""This process's place in the job, read once from the launcher's environment:
:func:`read_launch_env` (the pure rules: :mod:`.env`; what only Slurm knows: :mod:`.slurm`)."""
import os
from typing import Mapping, Optional

from ..gpu import gpus
from . import slurm
from .env import DistEnv, detect_launcher, read_dist_env


def read_launch_env(launcher: Optional[str] = None, num_gpus: Optional[int] = None,
                    environ: Optional[Mapping[str, str]] = None) -> DistEnv:
    """:func:`~mmddp_ext.launcher.env.read_dist_env` of ``environ`` (default ``os.environ``) with
    ``num_gpus`` (default: the GPUs visible to this process), the one rule for this rank's
    layout (a missing ``LOCAL_RANK`` is derived from the GPU count); under Slurm with the
    address of the step's first node asked from Slurm (:func:`mmddp_ext.launcher.slurm.master_addr`:
    its ``NodeAddr``, which every node reaches)."""
    environ = os.environ if environ is None else environ
    num_gpus = gpus().count() if num_gpus is None else num_gpus
    launcher = launcher or detect_launcher(environ)
    addr = slurm.master_addr(environ) if launcher == 'slurm' else None
    return read_dist_env(environ, launcher, num_gpus, slurm_master_addr=addr)
