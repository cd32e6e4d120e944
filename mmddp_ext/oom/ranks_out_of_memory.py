"""The ranks' vote on an out-of-memory error.

A step that runs out of memory on one rank must be retried (smaller) on every rank, or the
ranks' next collectives no longer match and the job hangs. The batch finder's trials and
``MicrobatchDDP`` therefore ask every rank whether its attempt fitted, with one all-gather
(:func:`ranks_out_of_memory`), and all act on the same answer. When the ranks agree to stop,
every rank raises :class:`RanksOutOfMemoryError`, which names the ranks that ran out, so that
the failure records and the diagnosis blame those and not the first rank to raise.
"""
from typing import List, Sequence

import torch
from mmengine.dist import all_gather


class RanksOutOfMemoryError(torch.OutOfMemoryError):
    """Raised on every rank when the ranks agree that some of them ran out of memory.

    Attributes:
        oom_ranks: The ranks that ran out of memory (the same list on every rank).
    """

    def __init__(self, message: str, oom_ranks: Sequence[int]) -> None:
        super().__init__(message)
        self.oom_ranks = sorted(int(r) for r in oom_ranks)

    def __reduce__(self):  # picklable with its ranks (elastic's error files, multiprocessing)
        return type(self), (str(self), self.oom_ranks)


def ranks_out_of_memory(ok: bool) -> List[int]:
    """The ranks that ran out of memory, from every rank's ``ok``: the same list on every
    rank. All ranks must call this (one all-gather; no-op when not distributed)."""
    flags = all_gather(torch.tensor([0 if ok else 1], dtype=torch.int64))
    return [rank for rank, flag in enumerate(flags) if flag.item()]
