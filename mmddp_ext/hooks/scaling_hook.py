"""``ScalingHook``: show the scaling plan, keep it in checkpoints, reconcile it on resume, and
report (and remember) a step down of the per-device batch during training."""
import math

from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from ..scaling.report import plan_table
from ..scaling.resume import convert_checkpoint, resume_factor

META_KEY = 'scaling_plan'


@HOOKS.register_module()
class ScalingHook(Hook):
    """Logs the runner's scaling plan, stores it in every checkpoint, checks it on resume.

    Added automatically by :class:`~mmddp_ext.runner.DDPRunner`; with another runner it only
    warns that there is no plan, and only if that runner trains. On resume with a checkpoint
    written under a plan:

    * same global batch and LRs, other samples per iteration (another world size or
      accumulation) → the iteration counter and the iteration-based schedulers are converted
      so training continues at the same number of samples seen;
    * another global batch or LR → :class:`~mmddp_ext.scaling.resume.ResumeMismatch` with the
      ``--cfg-options`` that reproduce the saved plan.
    """

    priority = 'VERY_HIGH'

    def __init__(self) -> None:
        self._micro_batches = 1

    def before_run(self, runner) -> None:
        """Log the plan once, on rank 0. A runner without a plan gets a warning, unless it
        has nothing to train (no train loop configured: built to validate or test only)."""
        plan = getattr(runner, 'scaling_plan', None)
        if runner.rank != 0:
            return
        # MMEngine's Runner keeps train_cfg in _train_loop, None when nothing is trained; the
        # public train_loop property would build the loop (and its dataloader) here.
        if plan is None and getattr(runner, '_train_loop', None) is None:
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

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        """When the guarded step (``MicrobatchDDP``) stepped down, say which batch is now in
        use and correct the finder's stored result, so the next run starts there."""
        model = runner.model
        micro = getattr(model, 'micro_batches', 1)
        plan = getattr(runner, 'scaling_plan', None)
        if micro <= self._micro_batches or plan is None:
            return
        self._micro_batches = micro
        batch = plan.per_device_batch_size
        now = math.ceil(batch / micro)
        if runner.rank == 0:
            runner.logger.warning(
                f'mmddp_ext: out of memory at iteration {runner.iter + 1}; training goes on '
                f'with per-device batch {batch} run as {micro} micro-batches of at most {now} '
                f'samples (global batch {plan.global_batch_size} and LR unchanged)')
        stored = getattr(runner, 'batch_probe', None)
        if stored is not None:
            from ..runner.batch_finder import correct_cache
            correct_cache(
                stored[0], stored[1], now, f'training ran out of memory at per-device batch '
                f'{math.ceil(batch / (micro // 2))}')
            if runner.rank == 0:
                runner.logger.warning(f'mmddp_ext: {stored[0]} now says {now}: the next run '
                                      f'plans with it')
