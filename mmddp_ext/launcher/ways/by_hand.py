"""Ranks started by hand: each process is given ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` (``LOCAL_RANK`` may be derived); rank 0 hosts the store
(:mod:`mmddp_ext.launcher.store`). Its variables are torch's, as torchrun's: only the detection
differs."""
from typing import Mapping

from .torchrun import NAME, ask, task_cpus, to_torch  # noqa: F401  (this way's parts)


def detect(environ: Mapping[str, str]) -> bool:
    return 'RANK' in environ or 'WORLD_SIZE' in environ
