"""A test-only hook: before the second checkpoint save, fills the disk of the work dir (a
small tmpfs the test mounted in its own mount namespace) to the last byte, so that the save
runs out of space for real (ENOSPC), and so does every record written there after it."""
import os
import os.path as osp

from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class FillDiskHook(Hook):
    """Fills the work dir's disk before the second save (rank 0)."""

    priority = 'VERY_LOW'

    def __init__(self) -> None:
        self.saves = 0

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        self.saves += 1
        if self.saves != 2 or runner.rank != 0:
            return
        chunk = b'\0' * 2**20
        fd = os.open(osp.join(runner.work_dir, 'filler.bin'), os.O_WRONLY | os.O_CREAT)
        try:
            while True:  # unbuffered: the last write is a partial one, then ENOSPC
                try:
                    if os.write(fd, chunk) == 0:
                        break
                except OSError:
                    break
        finally:
            os.close(fd)
