"""Collectives that keep the ranks of one step in agreement.

A step that runs out of memory on one rank must be retried (smaller) on every rank, or the
ranks' next collectives no longer match and the job hangs. The batch finder's trials and
``MicrobatchDDP`` therefore ask every rank whether its attempt fitted, with one all-gather,
and all act on the same answer. Which errors are out-of-memory errors is decided in
:mod:`mmddp_ext.memory.oom`.
"""
from typing import List


def ranks_out_of_memory(ok: bool) -> List[int]:
    """The ranks that ran out of memory, from every rank's ``ok``: the same list on every
    rank. All ranks must call this (one all-gather; no-op when not distributed)."""
    import torch
    from mmengine.dist import all_gather
    flags = all_gather(torch.tensor([0 if ok else 1], dtype=torch.int64))
    return [rank for rank, flag in enumerate(flags) if flag.item()]
