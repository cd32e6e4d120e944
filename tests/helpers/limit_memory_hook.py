"""A test-only hook: caps one rank's address space so that torch's allocator really fails."""
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from mmddp_ext.memory.budget import apply_budget


@HOOKS.register_module()
class LimitAddressSpaceHook(Hook):
    """Before training, ``RLIMIT_AS`` = current virtual size + ``budget_mib`` on ``rank``
    (:func:`mmddp_ext.memory.budget.apply_budget`, as ``scaling.memory_budget_mib`` does).

    A real out-of-memory error on a CPU: torch's allocator raises ``DefaultCPUAllocator:
    can't allocate memory`` once the budget is used up.

    Args:
        rank: the rank to limit.
        budget_mib: address space left for training, in MiB.
        after_iters: apply the limit after this many training iterations instead (0: before
            the first), so that what the first step allocates for good (optimizer state,
            oneDNN's kernels for this batch shape) is outside the budget.
    """

    priority = 'VERY_LOW'

    def __init__(self, rank: int, budget_mib: int, after_iters: int = 0) -> None:
        self.rank = rank
        self.budget_mib = budget_mib
        self.after_iters = after_iters

    def _apply(self, runner) -> None:
        if runner.rank == self.rank:
            apply_budget(self.budget_mib, torch.device('cpu'))

    def before_train(self, runner) -> None:
        if self.after_iters == 0:
            self._apply(runner)

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if self.after_iters and runner.iter + 1 == self.after_iters:
            self._apply(runner)
