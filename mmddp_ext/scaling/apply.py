"""Read :class:`ConfigFacts` from an MMEngine config and apply a :class:`ScalingPlan` to it.

A run parses its ``scaling`` block and plans once (:func:`check_scaling`, before any
rendezvous; the runner reuses the result), and :func:`apply_plan` is where a plan changes a
config. What changes:

* ``train_dataloader.batch_size`` ← per-device batch;
* ``optim_wrapper.accumulative_counts`` ← accumulation;
* ``optim_wrapper.optimizer.lr`` ← lr × lr_scale, and ``auto_scale_lr.enable`` ← False: the plan
  already includes MMEngine's linear rule (plus accumulation), so MMEngine must not scale again;
* iteration-based quantities × iter_scale: ``train_cfg.max_iters`` / ``val_interval`` of an
  IterBasedTrainLoop, ``begin``/``end``/``milestones``/``T_max``/``step_size``/``total_steps``/
  ``periods`` of every scheduler with ``by_epoch=False``, and the CheckpointHook ``interval``
  when it counts iterations. Epoch-based quantities stay.
"""
import os.path as osp
from dataclasses import dataclass
from typing import Any, List, Optional

from ..errors import ScalingError
from .config import ScalingConfig, check_runtime, parse_scaling
from .plan import ConfigFacts, ScalingPlan, make_plan, scale_iters

ITER_KEYS = ('begin', 'end', 'T_max', 'step_size', 'total_steps')
LIST_ITER_KEYS = ('milestones', 'periods')
INFINITE = 2**31  # MMEngine's schedulers default `end` to sys.maxsize: leave such ends alone


def _lrs(optim_wrapper: Any) -> tuple:
    optimizer = (optim_wrapper or {}).get('optimizer') or {}
    return (float(optimizer['lr']), ) if 'lr' in optimizer else ()


def read_facts(cfg: Any, auto_scale_lr_flag: bool = False) -> ConfigFacts:
    """The plain values the planner needs, read from an MMEngine config.

    Args:
        cfg: an ``mmengine.Config`` (or a dict of the same shape).
        auto_scale_lr_flag: ``--auto-scale-lr`` was given.
    """
    loader = cfg.get('train_dataloader') or {}
    if 'batch_size' not in loader:
        raise ValueError('train_dataloader.batch_size is missing: the scaling plan needs the '
                         'per-device batch the config was written for')
    optim_wrapper = cfg.get('optim_wrapper') or {}
    asl = cfg.get('auto_scale_lr') or {}
    name = osp.basename(cfg.get('filename') or getattr(cfg, 'filename', '') or 'config.py')
    return ConfigFacts(config_name=name, batch_size=loader['batch_size'],
                       accumulative_counts=optim_wrapper.get('accumulative_counts', 1),
                       auto_scale_lr_base=asl.get('base_batch_size'),
                       auto_scale_lr_enable=bool(asl.get('enable', False)
                                                 or auto_scale_lr_flag), lrs=_lrs(optim_wrapper))


def scaling_of(cfg: Any) -> ScalingConfig:
    """The config's ``scaling`` block, parsed and validated (once per run: pass the result to
    :func:`check_runtime_for_config` and :func:`plan_for_config`).

    Raises:
        ScalingError: naming the key, the value and the fix.
    """
    try:
        return parse_scaling(cfg.get('scaling'))
    except ValueError as e:
        raise ScalingError(str(e)) from e


def check_runtime_for_config(cfg: Any, cuda: bool, distributed: bool,
                             scaling: Optional[ScalingConfig] = None) -> ScalingConfig:
    """Check that ``cfg.scaling`` (parsed here unless given) can be honoured on this run (see
    :func:`mmddp_ext.scaling.config.check_runtime`); returns the parsed block.

    Raises:
        ScalingError: naming the setting and the fix.
    """
    scaling = scaling_of(cfg) if scaling is None else scaling
    try:
        check_runtime(scaling, cuda, distributed)
    except ValueError as e:
        raise ScalingError(str(e)) from e
    return scaling


def plan_for_config(cfg: Any, world_size: int, auto_scale_lr_flag: bool = False,
                    max_batch_per_device: Optional[int] = None,
                    scaling: Optional[ScalingConfig] = None) -> ScalingPlan:
    """Parse ``cfg.scaling`` (unless the parsed block ``scaling`` is given: a run parses it
    once, with :func:`scaling_of`, and passes it down) and plan for ``world_size`` processes.

    Raises:
        ScalingError: a bad ``scaling`` block or config value, or a global batch that
            ``world_size`` cannot share (the message names the value and the fix).
    """
    try:
        if scaling is None:
            scaling = parse_scaling(cfg.get('scaling'))
        return make_plan(scaling, read_facts(cfg, auto_scale_lr_flag), world_size,
                         max_batch_per_device)
    except ScalingError:
        raise
    except ValueError as e:
        raise ScalingError(str(e)) from e


@dataclass(frozen=True)
class CheckedScaling:
    """A config's ``scaling`` block parsed and checked, and the plan made from it for
    ``world_size`` processes (with ``max_batch_per_device='auto'``: before measuring)."""

    world_size: int
    scaling: ScalingConfig
    plan: ScalingPlan


def check_scaling(cfg: Any, world_size: int, cuda: bool, distributed: bool) -> CheckedScaling:
    """Parse ``cfg.scaling``, plan for ``world_size`` and check that this run can honour the
    block: the one pass every entry makes before any rendezvous.

    Raises:
        ScalingError: naming the key or setting, the value and the fix.
    """
    scaling = scaling_of(cfg)
    plan = plan_for_config(cfg, world_size, scaling=scaling)
    check_runtime_for_config(cfg, cuda, distributed, scaling)
    return CheckedScaling(world_size, scaling, plan)


def _set(changes: List[str], holder: Any, key: str, value: Any, where: str,
         default: Any = None) -> None:
    old = holder.get(key, default)
    if old != value:
        holder[key] = value
        changes.append(f'{where}.{key}: {old} → {value}')


def _scale_scheduler(sched: Any, iter_scale: float, where: str, changes: List[str]) -> None:
    if sched.get('by_epoch', True):
        return
    for key in ITER_KEYS:
        value = sched.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value < INFINITE:
            _set(changes, sched, key, scale_iters(value, iter_scale), where)
    for key in LIST_ITER_KEYS:
        if isinstance(sched.get(key), (list, tuple)):
            _set(changes, sched, key, [scale_iters(int(v), iter_scale) for v in sched[key]], where)


def _schedulers(cfg: Any) -> List[Any]:
    sched = cfg.get('param_scheduler')
    if sched is None:
        return []
    return list(sched) if isinstance(sched, (list, tuple)) else [sched]


def scale_iteration_quantities(cfg: Any, iter_scale: float) -> List[str]:
    """Multiply every iteration-based quantity of ``cfg`` by ``iter_scale`` (in place)."""
    changes: List[str] = []
    if iter_scale == 1.0:
        return changes
    train_cfg = cfg.get('train_cfg') or {}
    if train_cfg.get('type') == 'IterBasedTrainLoop' or 'max_iters' in train_cfg:
        for key in ('max_iters', 'val_interval', 'val_begin'):
            if isinstance(train_cfg.get(key), int) and train_cfg[key] > 0:
                _set(changes, train_cfg, key, scale_iters(train_cfg[key], iter_scale), 'train_cfg')
    for i, sched in enumerate(_schedulers(cfg)):
        _scale_scheduler(sched, iter_scale, f'param_scheduler[{i}]', changes)
    ckpt = (cfg.get('default_hooks') or {}).get('checkpoint') or {}
    if ckpt.get('by_epoch', True) is False and isinstance(ckpt.get('interval'), int) \
            and ckpt['interval'] > 0:
        _set(changes, ckpt, 'interval', scale_iters(ckpt['interval'], iter_scale),
             'default_hooks.checkpoint')
    return changes


def apply_plan(cfg: Any, plan: ScalingPlan) -> List[str]:
    """Apply ``plan`` to ``cfg`` in place; returns the changes as ``key: old → new`` lines."""
    changes: List[str] = []
    _set(changes, cfg.train_dataloader, 'batch_size', plan.per_device_batch_size,
         'train_dataloader')
    optim_wrapper = cfg.optim_wrapper
    if plan.accumulative_counts != optim_wrapper.get('accumulative_counts', 1):
        _set(changes, optim_wrapper, 'accumulative_counts', plan.accumulative_counts,
             'optim_wrapper', default=1)
    optimizer = optim_wrapper.get('optimizer') or {}
    if plan.lrs and 'lr' in optimizer:
        _set(changes, optimizer, 'lr', plan.lrs[0], 'optim_wrapper.optimizer')
    asl = cfg.get('auto_scale_lr')
    if asl and asl.get('enable', False):
        _set(changes, asl, 'enable', False, 'auto_scale_lr')
    changes += scale_iteration_quantities(cfg, plan.iter_scale)
    return changes
