"""The user's ``scaling`` config block: parsing and validation.

A config may carry a block such as::

    scaling = dict(global_batch_size=512, max_batch_per_device=64, lr_rule='linear')

:func:`parse_scaling` turns it into a validated, immutable :class:`ScalingConfig`. Every
mistake is a :class:`ValueError` whose message names the key, the value received, the
constraint and a fix. This module is pure standard library (no torch, no mmengine).
"""
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Union

from ..utils.checks import is_positive_int  # also imported from here by other modules
from ..utils.checks import closest, did_you_mean

SCALING_KEYS = ('global_batch_size', 'max_batch_per_device', 'base_batch_size', 'lr_rule',
                'schedule', 'memory_budget_mib', 'on_oom')
LR_RULES = ('linear', 'sqrt', 'none')
SCHEDULES = ('keep_samples', 'keep_iters')
ON_OOM = ('raise', 'microbatch')
AUTO = 'auto'


def _size_fix(key: str, value: Any) -> str:
    """A concrete suggestion for a bad size value, e.g. ``use 64 (scaling.key=64)``."""
    whole = None
    if isinstance(value, float) and value.is_integer() and value >= 1:
        whole = int(value)
    elif isinstance(value, str) and value.strip().isdigit() and int(value) >= 1:
        whole = int(value)
    if whole is not None:
        return f'use {whole} ({key}={whole}, a number without quotes or decimal point)'
    return f'use a whole number of samples, e.g. {key}=64'


def check_size(key: str, value: Any, allow_auto: bool = False, optional: bool = True) -> None:
    """Raise ValueError unless ``value`` is a positive int, None or (optionally) 'auto'.

    Args:
        key: The dotted name used in the message, e.g. ``'scaling.global_batch_size'``.
        value: The value to check.
        allow_auto: Whether the string ``'auto'`` is accepted.
        optional: Whether None is accepted.

    Raises:
        ValueError: naming the key, the value, the constraint and a fix.
    """
    if is_positive_int(value) or (optional and value is None) or (allow_auto and value == AUTO):
        return
    constraint = "a positive int or 'auto'" if allow_auto else 'a positive int'
    raise ValueError(f'{key}={value!r} ({type(value).__name__}) must be {constraint}: '
                     f'{_size_fix(key, value)}')


def check_choice(key: str, value: Any, allowed: tuple) -> None:
    """Raise ValueError unless ``value`` is one of the ``allowed`` strings.

    Args:
        key: The dotted name used in the message, e.g. ``'scaling.lr_rule'``.
        value: The value to check.
        allowed: The accepted strings.

    Raises:
        ValueError: naming the key, the value and the allowed values.
    """
    if isinstance(value, str) and value in allowed:
        return
    choices = ', '.join(repr(a) for a in allowed)
    hint = did_you_mean(value, allowed) if isinstance(value, str) else ''
    raise ValueError(f'{key}={value!r} is not allowed{hint}: use one of {choices}, '
                     f'e.g. {key}={allowed[0]}')


@dataclass(frozen=True)
class ScalingConfig:
    """A validated ``scaling`` block.

    Attributes:
        global_batch_size: Samples per optimizer step over all ranks and gradient
            accumulation; None lets the base batch size (or the config as written) decide.
        max_batch_per_device: Cap on the per-device batch; ``'auto'`` means "measure it"
            (resolved elsewhere; the planner treats it like None but the value is kept).
        base_batch_size: The global batch the config's learning rate was tuned for.
        lr_rule: How the LR follows the global batch: ``'linear'``, ``'sqrt'`` or ``'none'``.
        schedule: ``'keep_samples'`` rescales iteration counts so the number of samples seen
            stays the same; ``'keep_iters'`` keeps them as written.
        memory_budget_mib: Memory each rank may use for training, in MiB. On a CPU it is
            applied as an address-space limit (so going over it is a real out-of-memory
            error) and is required by ``max_batch_per_device='auto'``; on a GPU it caps the
            share of the device's memory this process may use. None: no limit.
        on_oom: ``'raise'`` (an out-of-memory error stops training) or ``'microbatch'`` (all
            ranks agree, the step is redone as smaller micro-batches; global batch and LR
            stay). None (the default): ``'microbatch'`` with ``max_batch_per_device='auto'``,
            so that a batch the finder picked never ends a run with an out-of-memory crash;
            else ``'raise'``. See :attr:`oom_policy`.
    """

    global_batch_size: Optional[int] = None
    max_batch_per_device: Union[int, str, None] = None
    base_batch_size: Optional[int] = None
    lr_rule: str = 'linear'
    schedule: str = 'keep_samples'
    memory_budget_mib: Optional[int] = None
    on_oom: Optional[str] = None

    def __post_init__(self) -> None:
        """Validate every field (see :func:`check_size` and :func:`check_choice`)."""
        check_size('scaling.global_batch_size', self.global_batch_size)
        check_size('scaling.max_batch_per_device', self.max_batch_per_device, allow_auto=True)
        check_size('scaling.base_batch_size', self.base_batch_size)
        check_choice('scaling.lr_rule', self.lr_rule, LR_RULES)
        check_choice('scaling.schedule', self.schedule, SCHEDULES)
        check_size('scaling.memory_budget_mib', self.memory_budget_mib)
        if self.on_oom is not None:
            check_choice('scaling.on_oom', self.on_oom, ON_OOM)

    @property
    def probe(self) -> bool:
        """Whether the per-device cap is to be measured (``max_batch_per_device='auto'``)."""
        return self.max_batch_per_device == AUTO

    @property
    def oom_policy(self) -> str:
        """``on_oom`` as given, else ``'microbatch'`` when the batch is measured, else
        ``'raise'``."""
        if self.on_oom is not None:
            return self.on_oom
        return 'microbatch' if self.probe else 'raise'


def _check_keys(block: Mapping[str, Any]) -> None:
    """Raise ValueError for the first key of ``block`` that is not in SCALING_KEYS."""
    valid = ', '.join(SCALING_KEYS)
    for key in block:
        if key in SCALING_KEYS:
            continue
        close = closest(key, SCALING_KEYS)
        hint = f': did you mean {close!r}?' if close is not None else '.'
        raise ValueError(f'unknown key scaling.{key} {key!r}{hint} Valid keys: {valid}')


def parse_scaling(block: Optional[Mapping[str, Any]]) -> ScalingConfig:
    """Parse a ``scaling`` config block into a :class:`ScalingConfig`.

    Args:
        block: The block as read from the config (any Mapping, e.g. an MMEngine
            ``ConfigDict``); None or an empty mapping gives the defaults.

    Returns:
        The validated configuration.

    Raises:
        ValueError: for a non-mapping block, an unknown key (with a did-you-mean) or a bad
            value (naming ``scaling.<key>=<value>``, the constraint and a fix).
    """
    if block is None:
        return ScalingConfig()
    if not isinstance(block, Mapping):
        raise ValueError(f'scaling={block!r} ({type(block).__name__}) must be a dict: '
                         f'write e.g. scaling = dict(global_batch_size=512)')
    _check_keys(block)
    return ScalingConfig(**{str(key): value for key, value in block.items()})


def check_runtime(scaling: ScalingConfig, cuda: bool, distributed: bool) -> None:
    """Raise ValueError for settings this run cannot honour (checked before any rendezvous).

    Args:
        scaling: The parsed block.
        cuda: Whether training runs on a GPU.
        distributed: Whether a launcher started this run (``launcher != 'none'``).
    """
    if scaling.probe and not cuda and scaling.memory_budget_mib is None:
        raise ValueError("scaling.max_batch_per_device='auto' on a CPU needs a memory budget "
                         "to measure against (RAM is shared by every process on the host): "
                         "set scaling.memory_budget_mib, e.g. --cfg-options "
                         "scaling.memory_budget_mib=4096, or give a number, e.g. "
                         "scaling.max_batch_per_device=32")
