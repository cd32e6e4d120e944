"""``GlobalLossHook``: exchanges the ranks' training losses on the iterations ``LoggerHook`` logs,
for :class:`~mmddp_ext.global_loss.log_processor.GlobalLossLogProcessor`."""
from typing import Any, Optional

import torch
from mmengine.dist import all_gather, get_world_size
from mmengine.hooks import Hook, LoggerHook
from mmengine.registry import HOOKS

from ..global_loss.log_processor import GlobalLossLogProcessor, losses_of, row_of


@HOOKS.register_module()
class GlobalLossHook(Hook):
    """Exchanges the ranks' training losses on the iterations ``LoggerHook`` logs.

    One gather of a fixed-size row of numbers per logged line (every rank decides alike), never
    per iteration. It runs before ``IterTimerHook`` ends the iteration's clock, so the wait for
    a later rank counts in this iteration's time, as DDP's own all-reduce would. The default
    hook ``global_loss`` of ``DDPRunner``; ``default_hooks.global_loss=None`` turns it off.
    """

    priority = 'ABOVE_NORMAL'  # after RuntimeInfoHook records the losses, before IterTimerHook

    def __init__(self) -> None:
        self.logger: Optional[LoggerHook] = None  # the run's LoggerHook, when there is an exchange

    def before_train(self, runner) -> None:
        """Whether this run exchanges at all, decided once: several ranks, our processor with a
        window of iterations, and a LoggerHook whose lines to follow."""
        processor = runner.log_processor
        self.logger = None
        if get_world_size() > 1 and isinstance(processor, GlobalLossLogProcessor) and \
                isinstance(processor.window_size, int):
            self.logger = next((h for h in runner.hooks if isinstance(h, LoggerHook)), None)

    def after_train_iter(self, runner, batch_idx: int, data_batch: Any = None,
                         outputs: Optional[dict] = None) -> None:
        if self.logger is None or not _logs_now(self.logger, runner, batch_idx):
            return
        processor = runner.log_processor
        local = processor.local_losses(runner)
        keys = list(local)
        rows = all_gather(torch.tensor(row_of(keys, [local[k] for k in keys]), dtype=torch.float64))
        losses = losses_of(keys, [row.tolist() for row in rows])
        processor.exchanged = None if losses is None else (runner.iter, losses)


def _logs_now(logger: LoggerHook, runner, batch_idx: int) -> bool:
    """Whether ``LoggerHook.after_train_iter`` logs a line at this iteration (its own rule)."""
    if logger.every_n_inner_iters(batch_idx, logger.interval):
        return True
    return logger.end_of_epoch(runner.train_dataloader,
                               batch_idx) and (not logger.ignore_last
                                               or len(runner.train_dataloader) <= logger.interval)
