"""A test-only hook: before the second checkpoint save, fills the disk of the work dir (a
small tmpfs the test mounted in its own mount namespace) until less space is free than the
first checkpoint took, so that the save runs out of space for real (ENOSPC)."""
import glob
import os
import os.path as osp
import shutil

from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class FillDiskHook(Hook):
    """Leaves half of the first checkpoint's size free before the second save (rank 0)."""

    priority = 'VERY_LOW'

    def __init__(self) -> None:
        self.saves = 0

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        self.saves += 1
        if self.saves != 2 or runner.rank != 0:
            return
        first = max(glob.glob(osp.join(runner.work_dir, '*.pth')), key=osp.getmtime)
        leave = osp.getsize(first) // 2
        chunk = b'\0' * 2**20
        with open(osp.join(runner.work_dir, 'filler.bin'), 'wb') as f:
            while shutil.disk_usage(runner.work_dir).free > leave + len(chunk):
                f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
