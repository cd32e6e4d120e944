"""Resuming on another number of processes without changing the training dynamics (pure).

A checkpoint written under a :class:`ScalingPlan` stores the plan in ``meta['scaling_plan']``.
On resume the saved plan is compared with the new one:

* same global batch and LRs, same samples per iteration → nothing to do;
* same global batch and LRs, other samples per iteration (e.g. 2 GPUs × 16 → 1 GPU × 16 ×
  accumulation 2) → the iteration counter and every iteration-based scheduler's position are
  converted by ``factor = saved samples_per_iter / new samples_per_iter``, so the run continues
  at the same number of samples seen, with the same LR;
* another global batch or LR → :class:`ResumeMismatch`, naming both plans and the
  ``--cfg-options`` that reproduce the saved one. Never silence.
"""
import math
from typing import Any, Dict, List, Mapping

from ..errors import ScalingError
from .plan import ScalingPlan, scale_iters

# Scheduler state that describes the schedule itself: after a conversion the freshly built
# (already rescaled) values are kept instead of the checkpoint's.
SCHEDULE_SHAPE_KEYS = ('begin', 'end', 'milestones', 'T_max', 'step_size', 'total_steps', 'periods')


class ResumeMismatch(ScalingError):
    """The checkpoint's plan cannot be continued with the same dynamics."""


def _describe(saved: Mapping[str, Any]) -> str:
    return (f'{saved["per_device_batch_size"]} per device × {saved["world_size"]} × '
            f'accumulation {saved["accumulative_counts"]} = global '
            f'{saved["global_batch_size"]}, LRs {saved.get("lrs")}')


def resume_factor(saved: Mapping[str, Any], plan: ScalingPlan) -> float:
    """``saved samples_per_iter / new samples_per_iter``; raises when dynamics would change.

    Args:
        saved: ``checkpoint['meta']['scaling_plan']`` (a :meth:`ScalingPlan.to_dict`).
        plan: the plan of this run.

    Raises:
        ResumeMismatch: another global batch or other learning rates.
    """
    now = plan.to_dict()
    if saved['global_batch_size'] != plan.global_batch_size:
        raise ResumeMismatch(
            f'the checkpoint was trained with {_describe(saved)}; this run would use '
            f'{_describe(now)}, which changes the training dynamics. Continue the same run '
            f'with --cfg-options scaling.global_batch_size={saved["global_batch_size"]}' +
            (f' scaling.base_batch_size={saved["base_batch_size"]}' if saved.get('base_batch_size'
                                                                                 ) else ''))
    old_lrs, new_lrs = list(saved.get('lrs') or []), list(plan.lrs)
    if len(old_lrs) == len(new_lrs) and not all(
            math.isclose(a, b, rel_tol=1e-9) for a, b in zip(old_lrs, new_lrs)):
        raise ResumeMismatch(
            f'the checkpoint was trained with learning rates {old_lrs}; this run would use '
            f'{new_lrs} (same global batch {plan.global_batch_size}): check '
            f'scaling.lr_rule (saved {saved.get("lr_rule")!r}) and scaling.base_batch_size '
            f'(saved {saved.get("base_batch_size")})')
    return saved['samples_per_iter'] / plan.samples_per_iter


def _convert_scheduler(state: Dict[str, Any], factor: float) -> None:
    if state.get('by_epoch', True):
        return
    if isinstance(state.get('last_step'), int) and state['last_step'] > 0:
        state['last_step'] = scale_iters(state['last_step'], factor)
    for key in SCHEDULE_SHAPE_KEYS:
        state.pop(key, None)


def convert_checkpoint(checkpoint: Dict[str, Any], factor: float) -> List[str]:
    """Convert the iteration counter and scheduler positions in place; returns what changed."""
    if factor == 1.0:
        return []
    meta = checkpoint['meta']
    old_iter = meta['iter']
    meta['iter'] = scale_iters(old_iter, factor)
    changes = [f'iteration {old_iter} → {meta["iter"]} (× {factor:g}: same samples seen)']
    scheds = checkpoint.get('param_schedulers')
    groups = scheds.values() if isinstance(scheds, dict) else [scheds or []]
    n = 0
    for group in groups:
        for state in group:
            if not state.get('by_epoch', True):
                _convert_scheduler(state, factor)
                n += 1
    if n:
        changes.append(f'{n} iteration-based scheduler(s) moved to the same point in samples')
    return changes
