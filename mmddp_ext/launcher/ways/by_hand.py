"""Ranks started by hand: each process is given ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` (``LOCAL_RANK`` may be derived); rank 0 hosts the store
(:mod:`mmddp_ext.launcher.store`)."""
from typing import Mapping, Optional

NAME = 'pytorch'  # torch's variables, as torchrun's


def detect(environ: Mapping[str, str]) -> bool:
    return 'RANK' in environ or 'WORLD_SIZE' in environ


def ask(environ: Mapping[str, str]) -> dict:
    return {}


def to_torch(environ: Mapping[str, str], asked: Mapping[str, str]) -> dict:
    return {}  # torch's variables already


def task_cpus(environ: Mapping[str, str]) -> Optional[int]:
    return None  # the node's cores, shared by its ranks
