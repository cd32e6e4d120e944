"""Where the batch finder stores its result for the next run (``batch_probe.json`` in the work
dir: :func:`cache_location`), the key of what the result depends on (:func:`cache_key`), and
the correction training makes after an out-of-memory error at the stored batch
(:meth:`StoredResult.correct`)."""
import hashlib
import json
import os.path as osp
from typing import Any, List, Mapping, NamedTuple, Optional

import torch
from mmengine.dist import broadcast_object_list, get_rank

from mmddp_launch.files import atomic_write_text

from ..gpu import gpus
from ..memory.budget import MARGIN
from .search import SearchResult
from .trials import CPU_RESERVE_MIB

CACHE_FILE = 'batch_probe.json'  # in the work dir: the measured batch, reused by a restart


def cache_key(facts: Mapping[str, Any]) -> str:
    """A stable digest of what a measured batch depends on (model, pipeline, optimizer,
    device, budget, margin, world size, ...), so a restarted run reuses the result and a
    changed one measures again. Values must be JSON-serialisable (others are turned into
    strings)."""
    text = json.dumps(facts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _cache_facts(cfg: Any, world_size: int, upper: int, device: torch.device,
                 budget_mib: Optional[int]) -> dict:
    hardware = 'cpu'
    if device.type == 'cuda':
        g = gpus()
        hardware = f'{g.name(device.index)} {g.mem_get_info(device.index)[1]}'
    return dict(model=cfg.model, dataset=cfg.train_dataloader.get('dataset'),
                collate=cfg.train_dataloader.get('collate_fn'), optim=cfg.optim_wrapper,
                wrapper=cfg.get('model_wrapper_cfg'), world_size=world_size, upper=upper,
                hardware=hardware, budget_mib=budget_mib, margin=MARGIN,
                cpu_reserve_mib=CPU_RESERVE_MIB, torch=torch.__version__)


def read_cache(path: str, key: str) -> Optional[SearchResult]:
    """Rank 0 reads ``path``; every rank gets the same answer."""
    found: List[Optional[dict]] = [None]
    if get_rank() == 0 and osp.isfile(path):
        try:
            with open(path) as f:
                stored = json.load(f)
            found[0] = stored['result'] if stored.get('key') == key else None
        except (OSError, ValueError, KeyError, TypeError):
            found[0] = None  # unreadable: measure again
    broadcast_object_list(found)
    return SearchResult.from_dict(found[0]) if found[0] else None


def write_cache(path: str, key: str, result: SearchResult, how: str) -> None:
    if get_rank() != 0:
        return
    atomic_write_text(
        path,
        json.dumps(dict(key=key, measured=how, margin=MARGIN, result=result.to_dict()), indent=1))


class StoredResult(NamedTuple):
    """Where the finder's result for a run is stored (``path``: None without a work dir) and
    the ``key`` of what it depends on. The runner hands it to the hooks as
    ``runner.batch_probe``."""

    path: Optional[str]
    key: str

    def correct(self, max_batch: int, why: str) -> None:
        """Store a smaller ``max_batch`` after training ran out of memory at the one the
        finder picked, so that the next run plans with it. Rank 0 writes; a no-op elsewhere or
        when no result was stored."""
        if not self.path or get_rank() != 0 or not osp.isfile(self.path):
            return
        try:
            with open(self.path) as f:
                stored = json.load(f)
        except (OSError, ValueError):
            return
        if stored.get('key') != self.key or stored['result']['max_batch'] <= max_batch:
            return
        stored.setdefault('corrections', []).append(
            dict(found=stored['result']['max_batch'], now=max_batch, why=why))
        stored['result']['max_batch'] = max_batch
        atomic_write_text(self.path, json.dumps(stored, indent=1))


def cache_location(cfg: Any, world_size: int, upper: int, device: torch.device,
                   budget_mib: Optional[int]) -> StoredResult:
    """Where the finder's result for this run is stored, and its key."""
    work_dir = cfg.get('work_dir')
    path = osp.join(work_dir, CACHE_FILE) if work_dir else None
    return StoredResult(path, cache_key(_cache_facts(cfg, world_size, upper, device, budget_mib)))
