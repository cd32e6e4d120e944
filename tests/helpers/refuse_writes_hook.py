"""A test-only hook: before the second checkpoint save, the work dir stops taking writes, as a
read-only remount, an export's rules or a quota do: ``chattr -R +i`` makes it and everything in
it immutable (root on ext4 and most local file systems), so the save and every record written
there after it are refused for real (EPERM). The test makes it writable again."""
import subprocess

from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class RefuseWritesHook(Hook):
    """Makes the work dir immutable before the second save (rank 0)."""

    priority = 'VERY_LOW'

    def __init__(self) -> None:
        self.saves = 0

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        self.saves += 1
        if self.saves == 2 and runner.rank == 0:
            subprocess.run(['chattr', '-R', '+i', runner.work_dir], check=True)
