"""A test-only hook: caps one rank's address space so that torch's allocator really fails."""
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from mmddp_ext.memory.budget import apply_budget

from tests.helpers.proc_status import proc_status


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


@HOOKS.register_module()
class LimitBelowStepHook(Hook):
    """On ``rank``, measure what one training step allocates and then cap the address space
    below it: the next steps at the same batch fail in torch's allocator for real.

    Before training, a loose budget makes glibc map large blocks on their own (as a real budget
    does), so a step's activations show in the kernel's ``VmPeak`` and are returned when freed.
    Iterations ``1 .. apply_after - 1`` (0-based; the first is skipped: it allocates the
    optimizer's state for good) are measured: the largest rise of ``VmPeak`` over ``VmSize`` at
    the iteration's start is the step's transient. After iteration ``apply_after``, the limit is
    the size then + ``fraction`` × that transient: a step of the same batch cannot fit, one of
    half the batch (about half the activations) can.

    Args:
        rank: the rank to limit. fraction: of the measured transient (0 < fraction < 1).
        apply_after: the iteration after which the limit is set (at least 2).
    """

    priority = 'VERY_LOW'

    def __init__(self, rank: int = 1, fraction: float = 0.75, apply_after: int = 2) -> None:
        self.rank, self.fraction, self.apply_after = rank, fraction, apply_after
        self.transient = 0
        self._start = None

    def before_train(self, runner) -> None:
        if runner.rank == self.rank:
            apply_budget(64 * 1024, torch.device('cpu'))

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if runner.rank == self.rank and 1 <= runner.iter <= self.apply_after:
            now = proc_status('VmSize', 'VmPeak')
            self._start = (now['VmSize'], now['VmPeak'])

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if runner.rank != self.rank or not 1 <= runner.iter <= self.apply_after:
            return
        size, peak_before = self._start
        peak = proc_status('VmPeak')['VmPeak']
        if peak > peak_before:  # this step reached a new peak: its transient is measured
            self.transient = max(self.transient, peak - size)
        if runner.iter == self.apply_after:
            if not self.transient:
                raise RuntimeError('LimitBelowStepHook: no step reached a new VmPeak; '
                                   'nothing was measured')
            mib = int(self.fraction * self.transient / 2**20)
            print(
                f'LimitBelowStepHook: rank {self.rank}: a step allocates '
                f'{self.transient / 2**20:.0f} MiB above its start; address space now '
                f'limited to +{mib} MiB', flush=True)
            apply_budget(mib, torch.device('cpu'))
