"""A test-only hook: one rank holds address space that the batch finder's trials never held.

``HoldMemoryHook(rank=1, mib=600)`` keeps a tensor of ``mib`` MiB on ``rank`` from
``before_train`` to the end of training (allocated, never written: it counts in the address
space that ``scaling.memory_budget_mib`` limits on a CPU, not in the host's RAM). It stands for
whatever a Runner holds beyond the finder's model, e.g. a large cache built by a hook.
"""
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class HoldMemoryHook(Hook):
    """Hold ``mib`` MiB on ``rank`` during training."""

    def __init__(self, rank: int, mib: int) -> None:
        self.rank, self.mib = rank, mib
        self.held = None

    def before_train(self, runner) -> None:
        if runner.rank == self.rank:
            self.held = torch.empty(self.mib * 2**20, dtype=torch.uint8)

    def after_train(self, runner) -> None:
        self.held = None
