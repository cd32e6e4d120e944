"""``ScalingHook``: show the scaling plan, keep it in checkpoints, reconcile it on resume."""
from typing import List, Optional

from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from ..scaling.plan import ScalingPlan
from ..scaling.resume import convert_checkpoint, resume_factor

META_KEY = 'scaling_plan'


def plan_table(plan: ScalingPlan, changes: Optional[List[str]] = None) -> str:
    """The plan as a small table for the log."""
    rows = [
        ('plan', plan.describe()),
        ('mode', f'{plan.mode} (lr_rule {plan.lr_rule}, schedule {plan.schedule})'),
        ('learning rates', ', '.join(f'{lr:.6g}' for lr in plan.lrs) or '(none in config)'),
        ('iterations', f'× {plan.iter_scale:g}: {plan.samples_per_iter} samples per iteration '
                       f'now, {plan.reference_samples_per_iter} as written for '
                       f'{plan.reference_world_size} device(s)'),
    ]
    rows += [('changed', c) for c in (changes or [])]
    rows += [('warning', w) for w in plan.warnings]
    width = max(len(k) for k, _ in rows)
    return '\n'.join(['mmddp_ext scaling plan'] + [f'  {k:<{width}}  {v}' for k, v in rows])


@HOOKS.register_module()
class ScalingHook(Hook):
    """Logs the runner's scaling plan, stores it in every checkpoint, checks it on resume.

    Added automatically by :class:`~mmddp_ext.runner.DDPRunner`; with another runner it only
    warns that there is no plan. On resume with a checkpoint written under a plan:

    * same global batch and LRs, other samples per iteration (another world size or
      accumulation) → the iteration counter and the iteration-based schedulers are converted
      so training continues at the same number of samples seen;
    * another global batch or LR → :class:`~mmddp_ext.scaling.resume.ResumeMismatch` with the
      ``--cfg-options`` that reproduce the saved plan.
    """

    priority = 'VERY_HIGH'

    def before_run(self, runner) -> None:
        """Log the plan once, on rank 0."""
        plan = getattr(runner, 'scaling_plan', None)
        if runner.rank != 0:
            return
        if plan is None:
            runner.logger.warning('ScalingHook: this runner has no scaling plan; use '
                                  "runner_type='DDPRunner' to plan batch size and LR")
            return
        runner.logger.info(plan_table(plan, getattr(runner, 'scaling_changes', [])))

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        """Store the plan in ``checkpoint['meta']['scaling_plan']``."""
        plan = getattr(runner, 'scaling_plan', None)
        if plan is not None:
            checkpoint.setdefault('meta', {})[META_KEY] = plan.to_dict()

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        """On resume, reconcile the saved plan with this run's (see the class docstring)."""
        plan = getattr(runner, 'scaling_plan', None)
        if plan is None or not getattr(runner, '_resume', False):
            return  # load_from: weights only, nothing to reconcile
        saved = checkpoint.get('meta', {}).get(META_KEY)
        if saved is None:
            runner.logger.warning('resuming from a checkpoint without a scaling plan: cannot '
                                  'check that global batch and LR are unchanged')
            return
        factor = resume_factor(saved, plan)
        for change in convert_checkpoint(checkpoint, factor):
            runner.logger.info(f'mmddp_ext resume on world size {plan.world_size} (saved on '
                               f'{saved["world_size"]}): {change}')
