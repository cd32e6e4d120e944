"""Plan the per-device batch, gradient accumulation, LR scale and iteration rescaling.

:func:`make_plan` combines the user's ``scaling`` block
(:class:`~mmddp_ext.scaling.config.ScalingConfig`), plain facts read from the MMEngine config
(:class:`ConfigFacts`) and the world size into a :class:`ScalingPlan`. Pure standard library:
reading the config and applying the plan is :mod:`~mmddp_ext.scaling.apply`, the split over
devices :mod:`~mmddp_ext.scaling.split`, the plan as a table :mod:`~mmddp_ext.scaling.report`.
The rules and worked examples: docs/scaling.md, from 'The `scaling` block' on.
"""
import math
import re
from dataclasses import dataclass, fields
from typing import Any, Dict, List, Optional, Tuple

from .config import ScalingConfig, check_size, is_positive_int
from .split import best_split, not_divisible, small_batch_warning

_NAME_TOKEN = re.compile(r'(\d+)xb(\d+)')
_LR_RULES = {'linear': lambda x: x, 'sqrt': math.sqrt, 'none': lambda x: 1.0}


@dataclass(frozen=True)
class ConfigFacts:
    """Plain values read from an MMEngine config.

    Attributes:
        config_name: The config file name, e.g. ``'td-hm_hrnet-w32_8xb64-210e_coco-256x192.py'``.
        batch_size: ``train_dataloader.batch_size`` as written (per device).
        accumulative_counts: ``optim_wrapper.accumulative_counts`` as written.
        auto_scale_lr_base: ``auto_scale_lr.base_batch_size``, or None.
        auto_scale_lr_enable: ``auto_scale_lr.enable`` (or the ``--auto-scale-lr`` flag).
        lrs: The base LR of each optimizer param group as written.
    """

    config_name: str
    batch_size: int
    accumulative_counts: int = 1
    auto_scale_lr_base: Optional[int] = None
    auto_scale_lr_enable: bool = False
    lrs: Tuple[float, ...] = ()

    def __post_init__(self) -> None:
        """Validate the sizes and store ``lrs`` as a tuple of floats."""
        check_size('train_dataloader.batch_size', self.batch_size, optional=False)
        check_size('optim_wrapper.accumulative_counts', self.accumulative_counts, optional=False)
        check_size('auto_scale_lr.base_batch_size', self.auto_scale_lr_base)
        object.__setattr__(self, 'lrs', tuple(float(lr) for lr in self.lrs))


@dataclass(frozen=True)
class ScalingPlan:
    """How to run a config on ``world_size`` devices.

    Attributes:
        mode: ``'recipe'`` (a global batch is fixed) or ``'per_device'`` (the config's
            per-device batch is kept, MMEngine's usual behaviour).
        world_size: Number of training processes.
        per_device_batch_size: The ``train_dataloader.batch_size`` to use.
        accumulative_counts: The ``optim_wrapper.accumulative_counts`` to use.
        global_batch_size: Samples per optimizer step; always
            ``per_device_batch_size * world_size * accumulative_counts``.
        base_batch_size: The global batch the LR was tuned for, or None if unknown.
        lr_rule: ``'linear'``, ``'sqrt'`` or ``'none'``.
        lr_scale: Factor applied to every learning rate.
        lrs: The config's LRs each multiplied by ``lr_scale``.
        reference_world_size: Number of devices the config was written for.
        reference_samples_per_iter: Samples per (micro-)iteration of the config as written.
        samples_per_iter: Samples per (micro-)iteration now
            (``per_device_batch_size * world_size``).
        iter_scale: Multiply iteration-based quantities (max_iters, warmup, milestones,
            intervals counted in iterations) by this.
        schedule: ``'keep_samples'`` or ``'keep_iters'``.
        warnings: Human-readable notes about guesses and poor choices.
    """

    mode: str
    world_size: int
    per_device_batch_size: int
    accumulative_counts: int
    global_batch_size: int
    base_batch_size: Optional[int]
    lr_rule: str
    lr_scale: float
    lrs: Tuple[float, ...]
    reference_world_size: int
    reference_samples_per_iter: int
    samples_per_iter: int
    iter_scale: float
    schedule: str
    warnings: Tuple[str, ...]

    def to_dict(self) -> Dict[str, Any]:
        """The plan as a JSON-ready dict (tuples become lists)."""
        out = {}
        for field in fields(self):
            value = getattr(self, field.name)
            out[field.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> 'ScalingPlan':
        """The plan back from :meth:`to_dict` (lists become tuples; other keys are ignored)."""
        values = {f.name: data[f.name] for f in fields(cls)}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})

    def describe(self) -> str:
        """One line, e.g. ``per-GPU batch 64 × 2 GPUs × accumulation 4 = global 512 (the
        config was tuned for 512) → LR × 1.0``."""
        gpus = 'GPU' if self.world_size == 1 else 'GPUs'
        if self.base_batch_size is None:
            base = '(no base batch size known)'
        else:
            base = f'(the config was tuned for {self.base_batch_size})'
        return (f'per-GPU batch {self.per_device_batch_size} × {self.world_size} {gpus} × '
                f'accumulation {self.accumulative_counts} = global {self.global_batch_size} '
                f'{base} → LR × {_format_scale(self.lr_scale)}')


def _format_scale(value: float) -> str:
    """Up to 4 significant digits, always with a decimal point: 1.0, 0.0625, 1.414."""
    text = f'{value:.4g}'
    return text if ('.' in text or 'e' in text or 'n' in text) else text + '.0'


def name_batch(config_name: str) -> Optional[Tuple[int, int]]:
    """Parse the ``NxbM`` token (N devices × M samples) of an OpenMMLab config name.

    Args:
        config_name: A file name or path, e.g. ``'td-hm_hrnet-w32_8xb64-210e_coco-256x192.py'``.

    Returns:
        ``(N, M)``, e.g. ``(8, 64)``, for the first token between ``_``/``-`` separators
        that reads ``NxbM`` with N, M >= 1; None when there is none.
    """
    stem = re.split(r'[\\/]', str(config_name))[-1]
    if stem.endswith('.py'):
        stem = stem[:-3]
    for token in re.split(r'[_-]', stem):
        match = _NAME_TOKEN.fullmatch(token)
        if match and int(match.group(1)) >= 1 and int(match.group(2)) >= 1:
            return int(match.group(1)), int(match.group(2))
    return None


def scale_iters(value: int, iter_scale: float) -> int:
    """Scale an iteration count, rounding half up.

    Args:
        value: A non-negative iteration count.
        iter_scale: A positive factor (:attr:`ScalingPlan.iter_scale`).

    Returns:
        ``round_half_up(value * iter_scale)``; 0 stays 0 and a positive value never
        becomes less than 1.

    Raises:
        ValueError: if ``value`` is not a non-negative int or ``iter_scale`` is not positive.
    """
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f'iteration count value={value!r} must be a non-negative int: '
                         f'pass a whole number of iterations, e.g. 500')
    if isinstance(iter_scale, bool) or not isinstance(iter_scale, (int, float)) \
            or not math.isfinite(iter_scale) or iter_scale <= 0:
        raise ValueError(f'iter_scale={iter_scale!r} must be a positive finite number: '
                         f'pass ScalingPlan.iter_scale')
    if value == 0:
        return 0
    return max(1, math.floor(round(value * iter_scale, 9) + 0.5))


def _resolve_base(scaling: ScalingConfig, facts: ConfigFacts) -> Tuple[Optional[int], str]:
    """The base batch size and the name of where it came from."""
    if scaling.base_batch_size is not None:
        return scaling.base_batch_size, 'scaling.base_batch_size'
    if facts.auto_scale_lr_base is not None:
        return facts.auto_scale_lr_base, 'auto_scale_lr.base_batch_size'
    return None, ''


def _unreachable_base(scaling: ScalingConfig, facts: ConfigFacts,
                      base: Tuple[Optional[int], str]) -> Optional[str]:
    """The warning for an ``auto_scale_lr.base_batch_size`` that no world size reproduces
    (not a multiple of batch × accumulation) and that would switch a config MMEngine runs
    per device into recipe mode; None when the base is usable or not used that way."""
    per_step = facts.batch_size * facts.accumulative_counts
    if (scaling.global_batch_size is not None or facts.auto_scale_lr_enable
            or base[1] != 'auto_scale_lr.base_batch_size' or base[0] % per_step == 0):
        return None
    below, above = base[0] // per_step * per_step, (base[0] // per_step + 1) * per_step
    multiples = f'{below} or {above}' if below else f'{above}'
    batch = f'train_dataloader.batch_size={facts.batch_size}' + (
        f' × accumulation {facts.accumulative_counts}' if facts.accumulative_counts > 1 else '')
    named = name_batch(facts.config_name)
    kept = 'batch and accumulation as written, LR × 1.0' + ('' if named else
                                                            ', iteration counts as written')
    name, fixes = '', f'scaling.global_batch_size={base[0]}'
    if named is not None and named[0] * named[1] * facts.accumulative_counts != base[0]:
        written = named[0] * named[1] * facts.accumulative_counts
        name = (f'; the config name says {named[0]}xb{named[1]} = {written} samples per step, '
                f'which also disagrees with it')
        fixes = (f'scaling.global_batch_size={written} (as the name says) or '
                 f'scaling.global_batch_size={base[0]} (as the base says)')
    return (f'auto_scale_lr.base_batch_size={base[0]} is not a whole number of per-device '
            f'steps ({batch} = {per_step} samples), so no world size reproduces it{name}: keeping '
            f"MMEngine's per-device semantics ({kept}); "
            f'for a fixed global batch set auto_scale_lr.base_batch_size to a multiple of '
            f'{per_step} (e.g. {multiples}) or {fixes}')


def _resolve_cap(scaling: ScalingConfig, facts: ConfigFacts, measured: Optional[int]) -> int:
    """The per-device cap: measured, else an int scaling.max_batch_per_device, else as written."""
    if measured is not None:
        return measured
    written = scaling.max_batch_per_device
    return written if is_positive_int(written) else facts.batch_size


def _recipe_split(scaling: ScalingConfig, facts: ConfigFacts, world_size: int,
                  measured: Optional[int], base: Tuple[Optional[int], str],
                  warnings: List[str]) -> Tuple[int, int]:
    """``(per_device, accumulation)`` for recipe mode; may append a warning."""
    if scaling.global_batch_size is not None:
        global_batch, source = scaling.global_batch_size, 'scaling.global_batch_size'
    else:
        global_batch, source = base
    cap = _resolve_cap(scaling, facts, measured)
    split = best_split(global_batch, world_size, cap)
    if split is None:
        raise not_divisible(global_batch, world_size, source)
    small_batch_warning(global_batch, world_size, cap, split, warnings)
    return split


def _per_device_split(scaling: ScalingConfig, facts: ConfigFacts, measured: Optional[int],
                      warnings: List[str]) -> Tuple[int, int]:
    """The config's own batch and accumulation; a batch above the cap is split into a smaller
    per-device batch with more accumulation, keeping the samples per device per step."""
    cap = _resolve_cap(scaling, facts, measured)
    if cap >= facts.batch_size:
        return facts.batch_size, facts.accumulative_counts
    per_device, accumulation = best_split(facts.batch_size * facts.accumulative_counts, 1, cap)
    if 2 * per_device < cap:
        warnings.append(f'train_dataloader.batch_size={facts.batch_size} × accumulation '
                        f'{facts.accumulative_counts} is split as per-device batch {per_device} '
                        f'× accumulation {accumulation} to stay within the per-device cap {cap} '
                        f'(a batch size with more divisors splits closer to the cap)')
    return per_device, accumulation


def _lr_scale(rule: str, global_batch: int, base: Optional[int], warnings: List[str],
              quiet: bool = False) -> float:
    """``rule(global_batch / base)``; 1.0 when the base is unknown (with a warning unless
    ``quiet``: the caller has said why already)."""
    if base is None:
        if rule != 'none' and not quiet:
            warnings.append('LR kept as written (× 1.0) because no base batch size is known: '
                            'set scaling.base_batch_size (or auto_scale_lr.base_batch_size) '
                            'to the global batch the LR was tuned for')
        return 1.0
    return float(_LR_RULES[rule](global_batch / base))


def _reference_world_size(facts: ConfigFacts, base: Optional[int]) -> Optional[int]:
    """Devices the config was written for, from the base batch or the NxbM name, else None."""
    per_step = facts.batch_size * facts.accumulative_counts
    if base is not None and base % per_step == 0:
        return base // per_step
    named = name_batch(facts.config_name)
    return named[0] if named else None


def _name_warning(facts: ConfigFacts, base: Tuple[Optional[int], str], warnings: List[str]) -> None:
    """Warn when the NxbM name disagrees with the base batch size."""
    named = name_batch(facts.config_name)
    accumulation = facts.accumulative_counts
    if named is None or base[0] is None or named[0] * named[1] * accumulation == base[0]:
        return
    expected = named[0] * named[1] * accumulation
    says = f'{named[0]}xb{named[1]}' + (f' × accumulation {accumulation}'
                                        if accumulation > 1 else '')
    warnings.append(f'config name says {says} = {expected} samples per step, but the reference '
                    f'batch ({base[1]}) is {base[0]}: the LR scale uses {base[0]}; set '
                    f'scaling.base_batch_size={expected} if the name is right')


def _iteration_scale(scaling: ScalingConfig, facts: ConfigFacts, mode: str,
                     reference: Optional[int], samples_per_iter: int, warnings: List[str],
                     quiet: bool = False) -> float:
    """The iteration factor for the schedule; may append a warning (not the one for an
    unknown reference when ``quiet``)."""
    if scaling.schedule == 'keep_iters':
        return 1.0
    if reference is None and mode == 'per_device':
        if not quiet:
            warnings.append(f'iteration counts kept as written: the number of devices '
                            f'{facts.config_name!r} was written for is unknown (no usable '
                            f'base batch size and no NxbM in the name); set '
                            f'scaling.base_batch_size')
        return 1.0
    if reference is None:
        warnings.append(f'assuming {facts.config_name!r} was written for 1 device (no '
                        f'usable base batch size and no NxbM in the name) when rescaling '
                        f'iterations; set scaling.base_batch_size or scaling.schedule=keep_iters')
    return facts.batch_size * (reference or 1) / samples_per_iter


def make_plan(scaling: ScalingConfig, facts: ConfigFacts, world_size: int,
              max_batch_per_device: Optional[int] = None) -> ScalingPlan:
    """Plan batch, accumulation, LR and iterations for ``world_size`` devices.

    Args:
        scaling: The parsed ``scaling`` block.
        facts: Values read from the MMEngine config.
        world_size: Number of training processes (positive int).
        max_batch_per_device: A measured per-device cap overriding
            ``scaling.max_batch_per_device`` (used once ``'auto'`` was measured).

    Returns:
        The plan; worked examples: docs/scaling.md, 'Worked example 2: an `8xb64` recipe on
        other GPU counts'.

    Raises:
        ValueError: for a bad world size or cap, or a global batch that ``world_size``
            does not divide (the message lists the nearest valid global sizes).
    """
    if not is_positive_int(world_size):
        raise ValueError(f'world_size={world_size!r} ({type(world_size).__name__}) must be a '
                         f'positive int: pass the number of training processes, e.g. 2')
    check_size('max_batch_per_device', max_batch_per_device)
    base = _resolve_base(scaling, facts)
    warnings: List[str] = []
    unreachable = _unreachable_base(scaling, facts, base)
    if unreachable is not None:  # one warning says it all: planned as without a base
        warnings.append(unreachable)
        base = (None, '')
    if scaling.probe and max_batch_per_device is None:
        warnings.append(f"scaling.max_batch_per_device='auto' is measured when training starts; "
                        f"until then this plan assumes the config's batch_size "
                        f"{facts.batch_size} as the per-device cap")
    if scaling.global_batch_size is None and (base[0] is None or facts.auto_scale_lr_enable):
        mode = 'per_device'
        per_device, accumulation = _per_device_split(scaling, facts, max_batch_per_device, warnings)
    else:
        mode = 'recipe'
        per_device, accumulation = _recipe_split(scaling, facts, world_size, max_batch_per_device,
                                                 base, warnings)
    global_batch = per_device * world_size * accumulation
    quiet = unreachable is not None
    lr_scale = _lr_scale(scaling.lr_rule, global_batch, base[0], warnings, quiet)
    reference = _reference_world_size(facts, base[0])
    iter_scale = _iteration_scale(scaling, facts, mode, reference, per_device * world_size,
                                  warnings, quiet)
    _name_warning(facts, base, warnings)
    return ScalingPlan(mode=mode, world_size=world_size, per_device_batch_size=per_device,
                       accumulative_counts=accumulation, global_batch_size=global_batch,
                       base_batch_size=base[0], lr_rule=scaling.lr_rule, lr_scale=lr_scale,
                       lrs=tuple(lr * lr_scale for lr in facts.lrs), reference_world_size=reference
                       or 1, reference_samples_per_iter=facts.batch_size * (reference or 1),
                       samples_per_iter=per_device * world_size, iter_scale=iter_scale,
                       schedule=scaling.schedule, warnings=tuple(warnings))
