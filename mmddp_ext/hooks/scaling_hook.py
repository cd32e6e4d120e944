"""``ScalingHook``: show the scaling plan, keep it in checkpoints, reconcile it on resume,
check the batch finder's measurement against training, and report (and remember) a step down
of the per-device batch during training."""
import math
from typing import List, Sequence, Tuple

import torch
from mmengine.dist import all_gather
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from ..memory.budget import held_bytes
from ..node.measure import runner_batchnorm_warning
from ..scaling.report import plan_table
from ..scaling.resume import convert_checkpoint, resume_factor
from ..utils.units import format_mib

META_KEY = 'scaling_plan'


def finder_check(extra: Sequence[int], reserve: Sequence[int], batch: int) -> Tuple[List[int], str]:
    """The ranks where training holds more beyond the finder's trials than the trials kept
    free for it, and one line saying so (``extra`` and ``reserve`` in bytes, by rank)."""
    over = [r for r, (e, k) in enumerate(zip(extra, reserve)) if e > k]
    each = ', '.join(f'rank {r} {format_mib(max(e, 0))} of {format_mib(k, unit="")}'
                     for r, (e, k) in enumerate(zip(extra, reserve)))
    if not over:
        return over, (f'batch probe check: after its first optimizer step training holds, beyond '
                      f'what the trials held, less than the trials kept free on every rank '
                      f'({each}): the measurement of per-device batch {batch} holds')
    return over, (f'batch probe check: the measurement was wrong on rank(s) {over}: after its '
                  f'first optimizer step training holds more beyond what the trials held than '
                  f'they kept free ({each}), so per-device batch {batch} may not fit there; '
                  f'a step that runs out is redone as micro-batches (on_oom=microbatch), and a '
                  f'larger reserve is kept with a larger scaling.memory_budget_mib')


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
        self._checked = False
        self.finder_over: List[int] = []  # ranks where the finder's check failed

    def before_run(self, runner) -> None:
        """Log the plan once, on rank 0. A runner without a plan gets a warning, unless it
        has nothing to train (no train loop configured: built to validate or test only)."""
        plan = getattr(runner, 'scaling_plan', None)
        if runner.rank != 0:
            return
        # the config says it (the public train_loop property would build the loop here)
        if plan is None and runner.cfg.get('train_cfg') is None:
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
        if plan is None or not runner.cfg.get('resume'):
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

    def _check_finder(self, runner) -> None:
        """After the first optimizer step, compare what each rank holds with what it held
        between the finder's trials (one all-gather, once; every rank has a baseline or none)."""
        baseline = getattr(runner, 'trial_baseline', None)
        plan = getattr(runner, 'scaling_plan', None)
        if self._checked or baseline is None or plan is None:
            return
        if (runner.iter + 1) < plan.accumulative_counts:
            return  # the optimizer has not stepped yet: its state is not allocated
        self._checked = True
        extra = held_bytes(torch.device(baseline.device)) - baseline.held_bytes
        mine = torch.tensor([extra, baseline.reserve_bytes], dtype=torch.int64)
        gathered = [t.tolist() for t in all_gather(mine)]
        self.finder_over, line = finder_check([g[0] for g in gathered], [g[1] for g in gathered],
                                              baseline.max_batch)
        if runner.rank == 0:
            (runner.logger.warning
             if self.finder_over else runner.logger.info)(f'[mmddp_ext] {line}')

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        """Check the finder's measurement once; when the guarded step (``MicrobatchDDP``)
        stepped down, say which batch is now in use and correct the finder's stored result,
        so the next run starts there."""
        self._check_finder(runner)
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
                f'[mmddp_ext] out of memory at iteration {runner.iter + 1}; training goes on '
                f'with per-device batch {batch} run as {micro} micro-batches of at most {now} '
                f'samples (global batch {plan.global_batch_size} and LR unchanged)')
            lowered = runner_batchnorm_warning(runner)  # its BatchNorms now see a micro-batch
            if lowered:
                runner.logger.warning(f'[mmddp_ext] {lowered}')
        stored = getattr(runner, 'batch_probe', None)
        if stored is not None:
            stored.correct(
                now, f'training ran out of memory at per-device batch '
                f'{math.ceil(batch / (micro // 2))}')
            if runner.rank == 0:
                runner.logger.warning(f'[mmddp_ext] {stored.path} now says {now}: the next run '
                                      f'plans with it')
