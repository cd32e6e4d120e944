"""Resuming in the middle of an epoch without training a batch twice or losing one.

MMEngine 0.10.7's ``EpochBasedTrainLoop`` starts a resumed epoch again from its first batch,
with the new run's sampler seed. :class:`ResumableEpochLoop` (``DDPRunner`` builds it where
MMEngine would build an ``EpochBasedTrainLoop``) continues at the next batch, with the
checkpoint's seed, and can stop in the middle of an epoch; its :class:`ResumableSampler` skips
the batches already trained without loading them. docs/stopping.md.
"""
import copy
import itertools
from typing import Any, Iterable, Optional

from mmengine.dataset import DefaultSampler, InfiniteSampler
from mmengine.registry import DATA_SAMPLERS, LOOPS
from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop
from torch.utils.data import BatchSampler

_EPOCH_LOOPS = ('EpochBasedTrainLoop', 'mmengine.EpochBasedTrainLoop', EpochBasedTrainLoop)
_ITER_LOOPS = ('IterBasedTrainLoop', 'mmengine.IterBasedTrainLoop', IterBasedTrainLoop)
# MMEngine's samplers and ours that skip without loading (the second in resumable_iter_loop.py)
_RESUMABLE_SAMPLERS = {
    key: ours
    for theirs, ours in ((DefaultSampler, 'ResumableSampler'), (InfiniteSampler,
                                                                'ResumableInfiniteSampler'))
    for key in (theirs, theirs.__name__, f'mmengine.{theirs.__name__}')
}


@DATA_SAMPLERS.register_module()
class ResumableSampler(DefaultSampler):
    """MMEngine's ``DefaultSampler`` whose next pass can start ``skip`` indices in.

    Attributes:
        skip: indices of this rank to leave out at the start of the next pass only.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.skip = 0

    def __iter__(self):
        indices = list(super().__iter__())
        skip, self.skip = self.skip, 0
        return iter(indices[skip:])


def resumable_loop_cfg(loop: Any) -> Any:
    """The train loop config with MMEngine's epoch-based loop replaced by
    :class:`ResumableEpochLoop` (``by_epoch=True`` or ``type='EpochBasedTrainLoop'``) and its
    iteration-based one by ``ResumableIterLoop`` (``by_epoch=False`` or
    ``type='IterBasedTrainLoop'``); any other loop config (or a built loop) as it is."""
    if not isinstance(loop, dict):
        return loop
    cfg = copy.deepcopy(loop)
    if 'type' not in cfg and cfg.get('by_epoch') in (True, False):
        cfg['type'] = 'ResumableEpochLoop' if cfg.pop('by_epoch') else 'ResumableIterLoop'
    elif cfg.get('type') in _EPOCH_LOOPS:
        cfg['type'] = 'ResumableEpochLoop'
    elif cfg.get('type') in _ITER_LOOPS:
        cfg['type'] = 'ResumableIterLoop'
    else:
        return loop
    return cfg


def resumable_dataloader_cfg(dataloader: Any) -> Any:
    """A dataloader config whose ``DefaultSampler`` becomes a :class:`ResumableSampler`, and
    whose ``InfiniteSampler`` a ``ResumableInfiniteSampler``."""
    if not isinstance(dataloader, dict) or not isinstance(dataloader.get('sampler'), dict):
        return dataloader
    kind = dataloader['sampler'].get('type')
    if not isinstance(kind, (str, type)) or kind not in _RESUMABLE_SAMPLERS:
        return dataloader
    cfg = copy.copy(dataloader)
    cfg['sampler'] = dict(dataloader['sampler'], type=_RESUMABLE_SAMPLERS[kind])
    return cfg


def use_resumed_seed(runner: Any, dataloader: Any) -> None:
    """After a resume, the sampler shuffles with the checkpoint's seed (``runner.seed``), as
    the interrupted run did, unless every rank has its own seed (``diff_rank_seed``)."""
    sampler: Optional[Any] = getattr(dataloader, 'sampler', None)
    randomness = runner.cfg.get('randomness') or {}
    if (isinstance(sampler, (DefaultSampler, InfiniteSampler))
            and not randomness.get('diff_rank_seed', False) and runner.seed is not None
            and sampler.seed != runner.seed):
        sampler.seed = runner.seed


@LOOPS.register_module()
class ResumableEpochLoop(EpochBasedTrainLoop):
    """``EpochBasedTrainLoop`` that resumes mid-epoch at the next batch and can stop mid-epoch.

    Takes ``EpochBasedTrainLoop``'s arguments.
    """

    stops_mid_epoch = True  # PreemptionHook: setting stop_training ends the epoch here

    def __init__(self, runner, dataloader, *args: Any, **kwargs: Any) -> None:
        super().__init__(runner, resumable_dataloader_cfg(dataloader), *args, **kwargs)
        self._stopped_mid_epoch = False

    def run(self) -> Any:
        """MMEngine's loop; an epoch stopped in the middle gets no validation."""
        use_resumed_seed(self.runner, self.dataloader)
        self.runner.call_hook('before_train')
        while self._epoch < self._max_epochs and not self.stop_training:
            self.run_epoch()
            if self._stopped_mid_epoch:
                break
            self._decide_current_val_interval()
            if (self.runner.val_loop is not None and self._epoch >= self.val_begin
                    and (self._epoch % self.val_interval == 0 or self._epoch == self._max_epochs)):
                self.runner.val_loop.run()
        self.runner.call_hook('after_train')
        return self.runner.model

    def run_epoch(self) -> None:
        """One epoch, from the batch after the last one trained: ``done = iter - epoch ×
        len(dataloader)`` batches of the epoch are behind us. Ends the epoch early, without
        ``after_train_epoch``, when ``stop_training`` is set during it."""
        done = self._iter - self._epoch * len(self.dataloader)
        done = done if 0 < done <= len(self.dataloader) else 0
        self.runner.call_hook('before_train_epoch')
        self.runner.model.train()
        for idx, data_batch in enumerate(self._batches(done), start=done):
            self.run_iter(idx, data_batch)
            if self.stop_training:
                self._stopped_mid_epoch = True
                return
        self.runner.call_hook('after_train_epoch')
        self._epoch += 1

    def _batches(self, done: int) -> Iterable:
        """The dataloader, without its first ``done`` batches: a :class:`ResumableSampler`
        under a plain ``BatchSampler`` starts ``done × batch_size`` indices in (no sample is
        loaded for the skipped batches); with another sampler or batch sampler the skipped
        batches are loaded and dropped (one log line says so). Exact on the same world size; on
        another one the samples skipped are the same number, not the same ones."""
        if done == 0:
            return self.dataloader
        loader = self.dataloader
        sampler = getattr(loader, 'sampler', None)
        self.runner.logger.info(f'[mmddp_ext] resuming epoch {self._epoch + 1} after batch '
                                f'{done} of {len(loader)}: continuing at batch {done + 1}')
        if (isinstance(sampler, ResumableSampler) and type(loader.batch_sampler) is BatchSampler
                and loader.batch_size):
            sampler.skip = done * loader.batch_size
            return loader
        self.runner.logger.info(f'[mmddp_ext] the sampler ({type(sampler).__name__}) cannot skip '
                                f'batches: loading and dropping the first {done}')
        return itertools.islice(loader, done, None)
