"""A test-only hook: makes one checkpoint save fail half-way through writing the file."""
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


class _Explodes:
    """Raises while being pickled, i.e. after torch.save has started writing the file."""

    def __reduce__(self):
        raise RuntimeError('injected failure in the middle of a checkpoint save')


@HOOKS.register_module()
class FailSaveHook(Hook):
    """The first checkpoint save of this run fails mid-write."""

    priority = 'VERY_LOW'

    def __init__(self) -> None:
        self.done = False

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        if not self.done:
            self.done = True
            # large data first, so the partial file is big, then the exploding object
            checkpoint['zz_padding'] = bytes(8 * 2**20)
            checkpoint['zz_boom'] = _Explodes()
