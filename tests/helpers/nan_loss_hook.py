"""Test-only, imported through ``custom_imports``: a NaN loss on one rank at one iteration.

``NanLossHook(rank=1, iteration=3)`` makes the model of ``rank`` return its ``loss*`` terms
multiplied by NaN in the forward pass of ``iteration`` (counted from 1, as MMEngine's log
counts): the loss, and through backward the gradients, become NaN as a real divergence makes
them. It patches the inner model's ``forward`` (DDP and ``MicrobatchDDP`` both call it).
"""
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS


@HOOKS.register_module()
class NanLossHook(Hook):
    """NaN loss terms on ``rank`` at ``iteration`` (``rank=None``: every rank)."""

    priority = 'VERY_LOW'

    def __init__(self, rank=1, iteration: int = 3) -> None:
        self.rank, self.iteration = rank, iteration
        self.armed = False

    def before_train(self, runner) -> None:
        if self.rank is not None and runner.rank != self.rank:
            return
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        forward, hook = model.forward, self

        def poisoned(*args, **kwargs):
            out = forward(*args, **kwargs)
            if hook.armed and kwargs.get('mode', args[2] if len(args) > 2 else None) == 'loss':
                out = {k: v * float('nan') if 'loss' in k else v for k, v in out.items()}
            return out

        model.forward = poisoned

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        self.armed = runner.iter + 1 == self.iteration

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        self.armed = False
