"""torchrun (torch.distributed.elastic, also under ``dist_train.sh`` and ``launch()``): its
agent sets torch's variables (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_*``, ...) and
``TORCHELASTIC_RUN_ID``, and hosts the rendezvous store itself."""
from typing import Mapping, Optional

NAME = 'pytorch'  # MMEngine's name for torch's variables, shared with ranks started by hand


def detect(environ: Mapping[str, str]) -> bool:
    return 'TORCHELASTIC_RUN_ID' in environ


def ask(environ: Mapping[str, str]) -> dict:
    return {}


def to_torch(environ: Mapping[str, str], asked: Mapping[str, str]) -> dict:
    return {}  # torch's variables already


def task_cpus(environ: Mapping[str, str]) -> Optional[int]:
    return None  # the node's cores, shared by its ranks
