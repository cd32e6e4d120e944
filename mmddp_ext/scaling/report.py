"""The scaling plan as text: one table, used by the training log and by ``--explain``.

Pure standard library. :func:`plan_rows` gives the rows (label, text), :func:`plan_table`
lays them out; callers add rows of their own around the plan's (``--explain`` adds the launch
topology before and the train loop after), so the plan reads the same wherever it is shown.
"""
from typing import Iterable, List, Optional, Sequence, Tuple

from .plan import ScalingPlan

TITLE = 'mmddp_ext scaling plan'
Row = Tuple[str, str]


def plan_rows(plan: ScalingPlan, changes: Iterable[str] = (),
              warnings: Optional[Sequence[str]] = None) -> List[Row]:
    """The plan, the config changes it makes and its warnings, as ``(label, text)`` rows.

    Args:
        plan: The plan.
        changes: ``key: old → new`` lines from :func:`~mmddp_ext.scaling.apply.apply_plan`.
        warnings: The warnings to show; default: the plan's own.
    """
    rows = [
        ('plan', plan.describe()),
        ('mode', f'{plan.mode} (lr_rule {plan.lr_rule}, schedule {plan.schedule})'),
        ('learning rates', ', '.join(f'{lr:.6g}' for lr in plan.lrs) or '(none in config)'),
        ('iterations', f'× {plan.iter_scale:g}: {plan.samples_per_iter} samples per iteration '
         f'now, {plan.reference_samples_per_iter} as written for '
         f'{plan.reference_world_size} device(s)'),
    ]
    rows += [('changed', c) for c in changes]
    rows += [('warning', w) for w in (plan.warnings if warnings is None else warnings)]
    return rows


def format_rows(rows: Sequence[Row], title: str = TITLE) -> str:
    """``title``, then one indented line per row with the labels aligned."""
    width = max((len(k) for k, _ in rows), default=0)
    return '\n'.join([title] + [f'  {k:<{width}}  {v}' for k, v in rows])


def plan_table(plan: ScalingPlan, changes: Iterable[str] = (), before: Sequence[Row] = (),
               after: Sequence[Row] = (), warnings: Optional[Sequence[str]] = None) -> str:
    """The plan as a small table, with rows of the caller's ``before`` and ``after`` it (the
    changes and warnings stay last). Example (what rank 0 logs)::

        mmddp_ext scaling plan
          plan            per-GPU batch 64 × 2 GPUs × accumulation 4 = global 512 ...
          mode            recipe (lr_rule linear, schedule keep_samples)
          learning rates  0.0005
          iterations      × 4: 128 samples per iteration now, 512 as written for 8 device(s)
          changed         optim_wrapper.accumulative_counts: 1 → 4
    """
    rows = plan_rows(plan, changes, warnings)
    split = next((i for i, (k, _) in enumerate(rows) if k in ('changed', 'warning')), len(rows))
    return format_rows([*before, *rows[:split], *after, *rows[split:]])
