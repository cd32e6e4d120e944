"""Resuming an iteration-based loop at its sampler, without loading the batches already trained.

MMEngine 0.10.7's ``IterBasedTrainLoop`` resumes at iteration N by loading N batches and
dropping them (``next()`` on the loader N times: open-mmlab/mmengine #1520 and #1633, a resume
that "looks hung" for hours on a large dataset), and its loader starts loading when the loop is
built, before the checkpoint says where to start. :class:`ResumableIterLoop` (``DDPRunner``
builds it where MMEngine would build an ``IterBasedTrainLoop``) starts the loader when training
starts, with its sampler N batches in: no batch before N is loaded. The same batches follow as
in a run that was never stopped, on the same world size. docs/stopping.md.
"""
import itertools
from typing import Any, Callable, Iterator, List, Optional, Tuple

from mmengine.dataset import InfiniteSampler
from mmengine.registry import DATA_SAMPLERS, LOOPS
from mmengine.runner import BaseLoop, IterBasedTrainLoop
from mmengine.runner.loops import _InfiniteDataloaderIterator
from mmengine.runner.utils import calc_dynamic_intervals
from torch.utils.data import BatchSampler

from .resumable_loop import ResumableSampler, resumable_dataloader_cfg, use_resumed_seed


@DATA_SAMPLERS.register_module()
class ResumableInfiniteSampler(InfiniteSampler):
    """MMEngine's ``InfiniteSampler`` whose next pass can start ``skip`` indices in.

    Every pass is this rank's stream of indices from its start (MMEngine's continues one stream
    made when the sampler is built); a loader takes a single pass of an infinite sampler, so a
    run sees the same indices as with MMEngine's.

    Attributes:
        skip: indices of this rank to leave out at the start of the next pass only.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.skip = 0

    def __iter__(self) -> Iterator[int]:
        skip, self.skip = self.skip, 0
        return itertools.islice(self._indices_of_rank(), skip, None)


class ResumedBatches(_InfiniteDataloaderIterator):
    """MMEngine's endless iterator over a loader (a new pass, with the next ``set_epoch``,
    after each finite one), from iteration ``start`` (counted from 0).

    With a :class:`ResumableInfiniteSampler` or :class:`ResumableSampler` under a plain
    ``BatchSampler`` the sampler starts ``start`` batches in and nothing before is loaded; with
    another one the first ``start`` batches are loaded and dropped, and ``log`` says so first.
    It keeps MMEngine's attributes (the loader, the open iterator, the passes made).
    """

    def __init__(self, loader: Any, start: int, log: Callable[[str], None] = print) -> None:
        # not MMEngine's __init__: it would open the loader before the sampler is moved on
        self._dataloader, self._epoch, drop = loader, 0, 0
        sampler = getattr(loader, 'sampler', None)
        plain = type(getattr(loader, 'batch_sampler', None)) is BatchSampler and loader.batch_size
        if start and plain and isinstance(sampler, ResumableInfiniteSampler):
            sampler.skip = start * loader.batch_size
        elif start and plain and isinstance(sampler, ResumableSampler):
            self._epoch, done = divmod(start, len(loader))
            sampler.set_epoch(self._epoch)
            sampler.skip = done * loader.batch_size
        elif start:
            drop = start
            log(f'the sampler ({type(sampler).__name__}) cannot skip batches: loading and '
                f'dropping the first {start}')
        self._iterator = iter(loader)
        for _ in range(drop):
            next(self)

    def __next__(self) -> Any:
        try:
            return next(self._iterator)
        except StopIteration:  # a finite sampler's pass is over: the next one, at once
            self._epoch += 1
            set_epoch = getattr(getattr(self._dataloader, 'sampler', None), 'set_epoch', None)
            if set_epoch is not None:
                set_epoch(self._epoch)
            self._iterator = iter(self._dataloader)
            return next(self._iterator)


@LOOPS.register_module()
class ResumableIterLoop(IterBasedTrainLoop):
    """``IterBasedTrainLoop`` whose loader starts when training starts, at the iteration a
    resume continues from (:class:`ResumedBatches`). Takes ``IterBasedTrainLoop``'s arguments.
    """

    def __init__(self, runner, dataloader: Any, max_iters: int, val_begin: int = 1,
                 val_interval: int = 1000,
                 dynamic_intervals: Optional[List[Tuple[int, int]]] = None) -> None:
        # IterBasedTrainLoop.__init__ less its last step, which starts the loader (its workers
        # load the first batches) before a resume can say where to start
        BaseLoop.__init__(self, runner, resumable_dataloader_cfg(dataloader))
        self._max_iters = int(max_iters)
        if self._max_iters != max_iters:
            raise ValueError(f'train_cfg.max_iters={max_iters!r} must be a whole number')
        self._max_epochs = 1
        self._epoch = 0
        self._iter = 0
        self.val_begin = val_begin
        self.val_interval = val_interval
        self.stop_training = False
        if hasattr(self.dataloader.dataset, 'metainfo'):
            self.runner.visualizer.dataset_meta = self.dataloader.dataset.metainfo
        self.dataloader_iterator: Optional[ResumedBatches] = None  # made by run()
        self.dynamic_milestones, self.dynamic_intervals = calc_dynamic_intervals(
            self.val_interval, dynamic_intervals)

    def run(self) -> Any:
        """MMEngine's loop, with the loader started at the iteration to train next."""
        use_resumed_seed(self.runner, self.dataloader)
        self.runner.call_hook('before_train')
        self.runner.call_hook('before_train_epoch')
        if self._iter > 0:
            self.runner.logger.info(f'[mmddp_ext] resuming after iteration {self._iter} of '
                                    f'{self._max_iters}: continuing at iteration {self._iter + 1}')
        self.dataloader_iterator = ResumedBatches(
            self.dataloader, self._iter,
            lambda line: self.runner.logger.info(f'[mmddp_ext] {line}'))
        while self._iter < self._max_iters and not self.stop_training:
            self.runner.model.train()
            self.run_iter(next(self.dataloader_iterator))
            self._decide_current_val_interval()
            if (self.runner.val_loop is not None and self._iter >= self.val_begin
                    and (self._iter % self.val_interval == 0 or self._iter == self._max_iters)):
                self.runner.val_loop.run()
        self.runner.call_hook('after_train_epoch')
        self.runner.call_hook('after_train')
        return self.runner.model
