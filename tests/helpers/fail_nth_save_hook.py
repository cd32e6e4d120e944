"""A test-only hook: the ``nth`` checkpoint save of this run fails half-way through writing
the file (the saves before it succeed)."""
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


class _Explodes:
    """Raises while being pickled, i.e. after torch.save has started writing the file."""

    def __reduce__(self):
        raise RuntimeError('injected failure in the middle of a checkpoint save')


@HOOKS.register_module()
class FailNthSaveHook(Hook):
    """Save number ``nth`` (1-based) of this run fails mid-write.

    Args:
        nth: which save fails.
    """

    priority = 'VERY_LOW'

    def __init__(self, nth: int = 1) -> None:
        self.nth = nth
        self.saves = 0

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        self.saves += 1
        if self.saves == self.nth:
            # large data first, so the partial file is big, then the exploding object
            checkpoint['zz_padding'] = bytes(8 * 2**20)
            checkpoint['zz_boom'] = _Explodes()
