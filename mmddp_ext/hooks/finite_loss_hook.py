"""``FiniteLossHook``: notice the first NaN or Inf loss on any rank and stop (default), warn or
skip the optimizer steps whose averaged gradients are not finite. ``DDPRunner`` adds it as the
default hook ``finite_loss`` with ``action='stop'``; change it with e.g.
``default_hooks = dict(finite_loss=dict(action='warn'))``. What each action does and why
'skip' needs no collective: docs/failures.md, "A NaN or Inf loss".
"""
import functools
import sys
from typing import Any, Dict, List, Sequence, Tuple

import torch
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.optim import AmpOptimWrapper, OptimWrapperDict
from mmengine.registry import HOOKS

from ..utils.checks import did_you_mean
from ..utils.tensors import nonfinite_indices

ACTIONS = ('stop', 'warn', 'skip')


class NonFiniteLossError(RuntimeError):
    """A loss term was NaN or Inf (``FiniteLossHook(action='stop')``).

    Attributes:
        rank: The rank whose loss it was.
        iteration: The iteration, counted from 1 as MMEngine's log and checkpoints count.
        terms: ``{name: value}`` of the non-finite loss terms.
        lr: The learning rate(s) of that iteration, as logged.
    """

    def __init__(self, message: str, rank: int, iteration: int, terms: Dict[str, float],
                 lr: str) -> None:
        super().__init__(message)
        self.rank, self.iteration, self.terms, self.lr = rank, iteration, terms, lr


def nonfinite_terms(log_vars: Any) -> Dict[str, float]:
    """The loss terms of ``log_vars`` (keys containing ``'loss'``, MMEngine's rule for what
    makes up the loss) that are NaN or Inf, with their values.

    A term that is the sum of its parts (MMEngine's ``loss``) is left out when a part explains
    it. Tensors with several elements give their first non-finite element.

    Example::

        >>> nonfinite_terms({'loss': torch.tensor(float('nan')),
        ...                  'loss_kpt': torch.tensor(float('nan')), 'acc_pose': 0.5})
        {'loss_kpt': nan}
    """
    if not isinstance(log_vars, dict):
        return {}
    bad = {}
    for key, value in log_vars.items():
        if 'loss' not in str(key):
            continue
        value = torch.as_tensor(value).detach()
        if not value.is_floating_point():
            continue
        finite = torch.isfinite(value)
        if not bool(finite.all()):
            bad[str(key)] = float(value.reshape(-1)[~finite.reshape(-1)][0])
    if len(bad) > 1:
        bad.pop('loss', None)  # the total, when its parts say which term it was
    return bad


def format_terms(terms: Dict[str, float]) -> str:
    """``loss_kpt=nan, loss_bbox=inf``."""
    return ', '.join(f'{k}={v}' for k, v in terms.items())


def format_lr(optim_wrapper: Any) -> str:
    """The current LR(s) of ``optim_wrapper``: ``5.0e-04``, or ``backbone 1.0e-04 / head
    1.0e-03`` for several groups or optimizers."""
    try:
        lrs = optim_wrapper.get_lr()
    except Exception:  # a custom wrapper without get_lr: the message goes on without it
        return '?'
    values: List[Tuple[str, float]] = []
    for key, group_lrs in lrs.items():
        if not key.endswith('lr') or key.endswith('base_lr'):
            continue
        prefix = key[:-len('lr')].rstrip('.')
        for lr in group_lrs:
            values.append((prefix, float(lr)))
    if len({v for _, v in values}) <= 1:
        return f'{values[0][1]:.1e}' if values else '?'
    return ' / '.join(f'{name} {v:.1e}'.strip() for name, v in values)


def nonfinite_grads(params: Sequence[torch.nn.Parameter]) -> List[int]:
    """Indices of the parameters in ``params`` whose gradient has a NaN or Inf; one
    device-to-host copy in all, no collective."""
    present = [(i, p.grad) for i, p in enumerate(params) if p.grad is not None]
    return [present[j][0] for j in nonfinite_indices([g for _, g in present])]


def _check_action(action: Any) -> str:
    if action in ACTIONS:
        return action
    raise ValueError(f'FiniteLossHook action={action!r} is not one of {", ".join(ACTIONS)}' +
                     did_you_mean(action, ACTIONS) +
                     "; e.g. default_hooks.finite_loss=dict(action='warn')")


@HOOKS.register_module()
class FiniteLossHook(Hook):
    """Stop, warn or skip the step at a NaN/Inf loss (docs/failures.md, "A NaN or Inf loss").

    Args:
        action: ``'stop'`` (raise :class:`NonFiniteLossError`), ``'warn'`` (log and go on) or
            ``'skip'`` (log, and skip optimizer steps whose averaged gradients are not finite).

    Attributes:
        nonfinite: How many iterations had a non-finite loss on this rank.
        skipped: How many optimizer steps were skipped (``'skip'``; the same on every rank).
    """

    # before the ParamSchedulerHook (LOW) moves the LR on, and before the CheckpointHook
    # (VERY_LOW) saves at an iteration-based interval
    priority = 'ABOVE_NORMAL'

    def __init__(self, action: str = 'stop') -> None:
        self.action = _check_action(action)
        self.nonfinite = 0
        self.skipped = 0
        self._handles: List[Any] = []

    def before_train(self, runner) -> None:
        """With ``'skip'``, add a step pre-hook (PyTorch's ``register_step_pre_hook``) to the
        optimizer(s) of ``runner.optim_wrapper`` that drops a step with non-finite gradients."""
        if self.action != 'skip':
            return
        wrapper = runner.optim_wrapper
        wrappers = list(wrapper.values()) if isinstance(wrapper, OptimWrapperDict) else [wrapper]
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        names = {id(p): n for n, p in model.named_parameters()}
        for inner in wrappers:
            if isinstance(inner, AmpOptimWrapper):
                if runner.rank == 0:
                    runner.logger.info("[mmddp_ext] FiniteLossHook action='skip': "
                                       'AmpOptimWrapper\'s loss scaler already skips steps '
                                       'with non-finite gradients')
                continue
            self._handles.append(
                inner.optimizer.register_step_pre_hook(
                    functools.partial(self._drop_nonfinite_step, runner, names)))

    def after_train(self, runner) -> None:
        """Remove the step pre-hooks :meth:`before_train` added."""
        while self._handles:
            self._handles.pop().remove()

    def _drop_nonfinite_step(self, runner, names: Dict[int, str], optimizer: Any, args: Any,
                             kwargs: Any) -> None:
        """Before ``optimizer.step``: when a gradient is not finite, set every gradient to
        None, which PyTorch's optimizers skip (no update, no momentum, no step count). It runs
        inside ``update_params`` (DDP) or ``MicrobatchDDP``'s step, after the gradients were
        averaged over ranks, so every rank drops the same steps."""
        params = [p for group in optimizer.param_groups for p in group['params']]
        bad = nonfinite_grads(params)
        if not bad:
            return
        for p in params:
            p.grad = None
        self.skipped += 1
        if runner.rank == 0:  # every rank decides the same: one line says it for all
            first = ', '.join(names.get(id(params[i]), f'#{i}') for i in bad[:3])
            runner.logger.warning(
                f'[mmddp_ext] optimizer step skipped at iteration {runner.iter + 1} on '
                f'every rank: {len(bad)} of {len(params)} gradients are not finite after '
                f'averaging over ranks ({first}{", ..." if len(bad) > 3 else ""}); '
                f'{self.skipped} step(s) skipped so far')

    def after_train_iter(self, runner, batch_idx: int, data_batch: Any = None,
                         outputs: Any = None) -> None:
        """Check this rank's loss terms; act on a non-finite one."""
        terms = nonfinite_terms(outputs)
        if not terms:
            return
        self.nonfinite += 1
        iteration = runner.iter + 1
        lr = format_lr(runner.optim_wrapper)
        head = (f'non-finite loss on rank {runner.rank} at iteration {iteration}: '
                f'{format_terms(terms)} (lr {lr})')
        if self.action == 'stop':
            raise NonFiniteLossError(
                f"{head}; stopping (FiniteLossHook action='stop'; to go on instead, set "
                "default_hooks.finite_loss=dict(action='warn') or action='skip')", runner.rank,
                iteration, terms, lr)
        if self.nonfinite & (self.nonfinite - 1):
            return  # say it at the 1st, 2nd, 4th, 8th, ... occurrence
        count = '' if self.nonfinite == 1 else f' (occurrence {self.nonfinite} on this rank)'
        if self.action == 'warn':
            tail = "action='warn': training goes on"
        else:
            tail = "action='skip': optimizer steps with non-finite gradients are skipped"
        _warn(runner, f'[mmddp_ext] {head}{count}; {tail}')


def _warn(runner, message: str) -> None:
    """A warning this rank must show itself: MMEngine's logger prints only rank 0's below
    ERROR, so other ranks write the line to stderr as well."""
    runner.logger.warning(message)
    if runner.rank != 0:
        print(message, file=sys.stderr, flush=True)
