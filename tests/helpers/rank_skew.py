"""Test-only, imported through ``custom_imports``: one rank sees another job, or is slow.

The config is the same on every rank (so its digest agrees); what the rank builds differs, as
on a node with a stale copy of the data or of the code:

- ``RankTrimmedCocoDataset(skew_rank=1, keep=48, ...)``: MMPose's ``CocoDataset``, of which
  rank ``skew_rank`` keeps only the first ``keep`` samples;
- ``RankSkewedPoseEstimator(skew_rank=1, ...)``: MMPose's ``TopdownPoseEstimator`` whose head
  has one output channel less on rank ``skew_rank``;
- ``SlowDataHook(rank=1, factor=3, warmup=2)``: after ``warmup`` iterations, rank ``rank``'s
  data pipeline sleeps ``factor`` times the iteration time it measured, per batch (spread
  over the batch's samples), so its loader is slower by a large factor on any machine.
"""
import os
import statistics
import time

from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from mmpose.datasets import CocoDataset
from mmpose.models import TopdownPoseEstimator
from mmpose.registry import DATASETS, MODELS


def _rank() -> int:
    return int(os.environ.get('RANK', 0))


@DATASETS.register_module()
class RankTrimmedCocoDataset(CocoDataset):
    """``CocoDataset``; rank ``skew_rank`` keeps only its first ``keep`` samples."""

    def __init__(self, skew_rank: int = 1, keep: int = 48, **kwargs) -> None:
        if _rank() == skew_rank:
            kwargs['indices'] = keep
        super().__init__(**kwargs)


@MODELS.register_module()
class RankSkewedPoseEstimator(TopdownPoseEstimator):
    """``TopdownPoseEstimator``; rank ``skew_rank``'s head has one output channel less."""

    def __init__(self, skew_rank: int = 1, **kwargs) -> None:
        if _rank() == skew_rank:
            kwargs['head'] = dict(kwargs['head'], out_channels=kwargs['head']['out_channels'] - 1)
        super().__init__(**kwargs)


@HOOKS.register_module()
class SlowDataHook(Hook):
    """Rank ``rank``'s data pipeline sleeps ``factor`` × its measured iteration per batch."""

    priority = 'VERY_LOW'

    def __init__(self, rank: int = 1, factor: float = 3, warmup: int = 2) -> None:
        self.rank, self.factor, self.warmup = rank, factor, warmup
        self.per_sample = 0.0
        self.times = []
        self.last = None

    def before_train(self, runner) -> None:
        if runner.rank == self.rank:
            runner.train_dataloader.dataset.pipeline.transforms.append(self._sleep)

    def _sleep(self, results):
        time.sleep(self.per_sample)
        return results

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        now = time.perf_counter()
        if runner.rank == self.rank and self.last is not None and len(self.times) < self.warmup:
            self.times.append(now - self.last)
            if len(self.times) == self.warmup:
                per_batch = self.factor * statistics.median(self.times)
                self.per_sample = per_batch / runner.train_dataloader.batch_size
                print(f'SlowDataHook: rank {self.rank} sleeps {per_batch:.3f} s per batch in its '
                      'data pipeline from now on', flush=True)  # rank 1's logger shows errors only
        self.last = now
