"""A test-only hook: one rank's memory budget, measured on the spot to be too small for a
training step, so that torch's allocator really fails there, on any machine."""
import json
import os.path as osp
import resource

import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from mmddp_ext.memory.budget import apply_budget

MIB = 2**20


@HOOKS.register_module()
class StepBudgetHook(Hook):
    """On ``rank``, just before the first training iteration (its batch already loaded), limit
    the address space to its size now + ``fraction`` × the bytes of the model's trainable
    parameters (:func:`mmddp_ext.memory.budget.apply_budget`).

    The first step of an optimizer with state allocates at least that state (Adam: two tensors
    per parameter), besides the forward's activations, all in large blocks that need new
    address space: with ``fraction`` < 1 it cannot fit, whatever the machine. Writes
    ``<work_dir>/step_budget_rank{R}.json`` with what it measured and the address-space limit
    it set (``as_limit_bytes``).

    Args:
        rank: the rank to limit.
        fraction: the budget as a fraction of the parameters' bytes.
    """

    priority = 'VERY_LOW'

    def __init__(self, rank: int, fraction: float = 0.5) -> None:
        self.rank = rank
        self.fraction = fraction
        self.applied = False

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if runner.rank != self.rank or self.applied:
            return
        self.applied = True
        params = sum(p.numel() * p.element_size() for p in runner.model.parameters()
                     if p.requires_grad)
        budget_mib = max(1, int(self.fraction * params / MIB))
        optimizer = type(runner.optim_wrapper.optimizer).__name__
        apply_budget(budget_mib, torch.device('cpu'))
        limit = resource.getrlimit(resource.RLIMIT_AS)[0]  # what it set: the address space
        with open(osp.join(runner.work_dir, f'step_budget_rank{runner.rank}.json'), 'w') as f:
            json.dump(
                dict(param_bytes=params, budget_mib=budget_mib, optimizer=optimizer,
                     as_limit_bytes=limit), f)
