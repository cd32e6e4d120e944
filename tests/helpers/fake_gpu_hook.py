"""A test-only hook for runs on the fake GPU host (``MMDDP_FAKE_GPUS``).

``FakeGpuHook(out_dir, stray_rank=1, stray_mib=1635)`` writes, per rank, the devices its
process had touched when training began and what replaced its GPU decisions
(``rank{R}.json``), then makes ``stray_rank`` keep
``stray_mib`` MiB on GPU 0, as ``torch.load`` without ``map_location`` does with a checkpoint
saved from GPU 0: with its context that is the user's 1.89 GiB on GPU 0.
"""
import json
import os
import os.path as osp
from typing import Optional

from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from mmddp_ext.gpu import gpus


@HOOKS.register_module()
class FakeGpuHook(Hook):
    """Record each rank's touched devices; optionally put a stray allocation on GPU 0."""

    def __init__(self, out_dir: str, stray_rank: Optional[int] = None, stray_mib: int = 0) -> None:
        self.out_dir, self.stray_rank, self.stray_mib = out_dir, stray_rank, stray_mib

    def before_train(self, runner) -> None:
        os.makedirs(self.out_dir, exist_ok=True)
        record = dict(rank=runner.rank, pid=os.getpid(), current=gpus().current(),
                      touched=gpus().touched, replacements=gpus().replacements)
        with open(osp.join(self.out_dir, f'rank{runner.rank}.json'), 'w') as f:
            json.dump(record, f)
        if runner.rank == self.stray_rank:
            gpus().hold(0, self.stray_mib * 2**20)
