"""``DDPRunner``: MMEngine's Runner with a scaling plan applied before anything is built.

Use it with ``runner_type = 'DDPRunner'`` (our ``_base_/ddp_runtime.py`` sets it). MMEngine's
``Runner.train()`` builds the dataloader, then the optimizer, scales the LR, then builds the
schedulers; batch size, accumulation, LR and iteration counts must be settled before that, so
the plan is computed and applied in :meth:`DDPRunner.from_cfg`:

1. the world size comes from the initialised process group, else from the launcher's
   environment (validated by :mod:`mmddp_ext.dist.env`);
2. the ``scaling`` block is parsed; ``memory_budget_mib`` is enforced and, with
   ``max_batch_per_device='auto'``, the per-device batch that fits on every rank is measured
   (:mod:`mmddp_ext.runner.probe`); then the block is planned (:mod:`mmddp_ext.scaling`) and
   applied to a copy of the config; ``auto_scale_lr.enable`` is switched off afterwards
   because the plan already includes MMEngine's rule (with accumulation) — so there is no
   double scaling;
3. a :class:`~mmddp_ext.hooks.ScalingHook` (logs the plan, stores it in checkpoints,
   reconciles a resume on another world size) and a
   :class:`~mmddp_ext.hooks.RankMemoryHook` (``interval=50``) are added unless the config's
   ``custom_hooks`` list them already;
4. checkpoints are written atomically (temporary file, fsync, rename) and resumed with
   ``map_location='cpu'``;
5. distributed runs get the lean DDP wrapper (:func:`mmddp_ext.dist.wrapper.ddp_wrapper_cfg`;
   :class:`~mmddp_ext.dist.microbatch.MicrobatchDDP` with ``on_oom='microbatch'``) and, if
   nobody initialised the process group yet (e.g. MMDetection's ``tools/train.py``), it is
   initialised here — gloo on CPU, where MMEngine's CUDA-only ``init_dist`` fails.
"""
import copy
import os
import os.path as osp
from typing import Any, List, Optional

from mmengine.config import Config
from mmengine.dist import is_main_process
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

from ..dist.env import read_dist_env
from ..dist.launch import init_distributed
from ..dist.wrapper import ddp_wrapper_cfg
from ..memory.budget import apply_budget
from ..scaling.apply import apply_plan, check_runtime_for_config, plan_for_config
from ..scaling.config import ScalingConfig


# Added unless the config lists them itself (e.g. with another interval).
DEFAULT_HOOKS = (dict(type='ScalingHook'), dict(type='RankMemoryHook', interval=50))


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _world_size(launcher: str) -> int:
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return read_dist_env(os.environ, launcher).world_size


def _init_process_group(launcher: str, env_cfg: Optional[dict]) -> None:
    import torch.distributed as dist
    if launcher != 'none' and not (dist.is_available() and dist.is_initialized()):
        dist_cfg = (env_cfg or {}).get('dist_cfg', {})
        init_distributed(read_dist_env(os.environ, launcher), dist_cfg.get('backend'),
                         dist_cfg.get('timeout'))


def _measure(cfg: Any, scaling: ScalingConfig, launcher: str,
             world_size: int) -> Optional[int]:
    """Apply ``scaling.memory_budget_mib`` and, for ``max_batch_per_device='auto'``, measure
    the per-device batch that fits on every rank (:mod:`mmddp_ext.runner.probe`)."""
    if scaling.memory_budget_mib is None and not scaling.probe:
        return None
    import torch
    from mmengine.device import get_device
    device = torch.device(get_device())
    if device.type == 'cuda' and device.index is None:
        device = torch.device('cuda', torch.cuda.current_device())
    budget = apply_budget(scaling.memory_budget_mib, device)
    if not scaling.probe:
        return None
    from .probe import find_max_batch
    _init_process_group(launcher, cfg.get('env_cfg'))
    loose = plan_for_config(cfg, world_size, max_batch_per_device=2 ** 31)
    upper = loose.per_device_batch_size * loose.accumulative_counts
    return find_max_batch(cfg, world_size, upper, budget, scaling.memory_budget_mib,
                          device).max_batch


@RUNNERS.register_module()
class DDPRunner(Runner):
    """A Runner whose batch size, accumulation, LR and schedule follow the ``scaling`` plan.

    Construct it with :meth:`from_cfg` (``RUNNERS.build(cfg)`` does). Attributes added to the
    stock Runner:

    Attributes:
        scaling_plan: the :class:`~mmddp_ext.scaling.ScalingPlan` of this run.
        scaling_changes: the config changes the plan made, as ``key: old → new`` lines.
    """

    scaling_plan = None
    scaling_changes: List[str] = []

    @classmethod
    def from_cfg(cls, cfg: Any) -> 'DDPRunner':
        """Plan, apply the plan to a copy of ``cfg``, then build the Runner."""
        cfg = copy.deepcopy(cfg if isinstance(cfg, Config) else Config(cfg))
        launcher = cfg.get('launcher', 'none')
        world_size = _world_size(launcher)
        import torch
        scaling = check_runtime_for_config(cfg, torch.cuda.is_available(), launcher != 'none')
        if launcher != 'none':
            local_rank = int(os.environ.get('LOCAL_RANK', 0))
            cfg.model_wrapper_cfg = ddp_wrapper_cfg(cfg, torch.cuda.is_available(), local_rank,
                                                    scaling.on_oom)
        measured = _measure(cfg, scaling, launcher, world_size)
        plan = plan_for_config(cfg, world_size, max_batch_per_device=measured)
        changes = apply_plan(cfg, plan)
        hooks = list(cfg.get('custom_hooks') or [])
        for default in DEFAULT_HOOKS:
            if not any(str(h.get('type')).split('.')[-1] == default['type'] for h in hooks):
                hooks.append(dict(default))
        cfg.custom_hooks = hooks
        runner = super().from_cfg(cfg)
        runner.scaling_plan = plan
        runner.scaling_changes = changes
        return runner

    def save_checkpoint(self, out_dir: str, filename: str, file_client_args=None,
                        save_optimizer: bool = True, save_param_scheduler: bool = True,
                        meta=None, by_epoch: bool = True, backend_args=None) -> None:
        """MMEngine's save, made atomic for local files: write ``.<name>.part``, fsync,
        rename. A crash mid-save leaves the previous file of that name intact, and the
        CheckpointHook updates ``last_checkpoint`` only after this returns."""
        args = (file_client_args, save_optimizer, save_param_scheduler, meta, by_epoch,
                backend_args)
        if file_client_args or backend_args or '://' in str(out_dir):
            return super().save_checkpoint(out_dir, filename, *args)  # remote: as MMEngine
        part = osp.join(out_dir, f'.{filename}.part')
        main = is_main_process()  # MMEngine writes on the main process only; so do we
        try:
            super().save_checkpoint(out_dir, osp.basename(part), *args)
        except BaseException:
            if main and osp.exists(part):
                os.remove(part)
            raise
        if main:
            _fsync(part)
            os.replace(part, osp.join(out_dir, filename))
            _fsync(out_dir)

    def resume(self, filename: str, resume_optimizer: bool = True,
               resume_param_scheduler: bool = True, map_location='cpu') -> None:
        """MMEngine's resume, loading to CPU by default (no transient second copy of the
        weights and optimizer state on the GPU; tensors move to their parameters' device)."""
        return super().resume(filename, resume_optimizer, resume_param_scheduler, map_location)

    def setup_env(self, env_cfg: dict) -> None:
        """Initialise the process group ourselves (gloo on CPU, bounded rendezvous) when the
        entry point did not, then let MMEngine do the rest of its set-up."""
        if self.distributed:
            _init_process_group(self.launcher, env_cfg)
        super().setup_env(env_cfg)
