"""A test-only hook: caps one rank's address space so that torch's allocator really fails."""
import resource

import psutil
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class LimitAddressSpaceHook(Hook):
    """Before training, ``RLIMIT_AS`` = current virtual size + ``budget_mib`` on ``rank``.

    A real out-of-memory error on a CPU: torch's allocator raises ``DefaultCPUAllocator:
    can't allocate memory`` once the budget is used up.

    Args:
        rank: the rank to limit.
        budget_mib: address space left for training, in MiB.
    """

    priority = 'VERY_LOW'

    def __init__(self, rank: int, budget_mib: int) -> None:
        self.rank = rank
        self.budget = budget_mib * 2 ** 20

    def before_train(self, runner) -> None:
        if runner.rank == self.rank:
            vms = psutil.Process().memory_info().vms
            _, hard = resource.getrlimit(resource.RLIMIT_AS)
            resource.setrlimit(resource.RLIMIT_AS, (vms + self.budget, hard))
