"""``FiniteCheckpointHook``: MMEngine's ``CheckpointHook`` that refuses a save with non-finite
weights before it removes or records anything."""
from typing import Any

from mmengine.hooks import CheckpointHook
from mmengine.registry import HOOKS

from ..checkpoint.save import refuse_nonfinite


class NonFiniteRefusal:
    """Mixed into a ``CheckpointHook`` (class): a save is refused, when the weights are not
    finite, *before* the hook removes the oldest or the previous best checkpoint or records
    ``last_ckpt``/``best_score``/``best_ckpt``, so no record names a file never written and a
    non-finite model never becomes the best. The hook has no public step in between, so the
    two methods it overrides are listed in :mod:`mmddp_ext.utils.mmengine_private`."""

    def _save_checkpoint_with_step(self, runner: Any, step: int, meta: dict) -> None:
        if not refuse_nonfinite(runner, str(self.filename_tmpl.format(step))):
            super()._save_checkpoint_with_step(runner, step, meta)

    def _save_best_checkpoint(self, runner: Any, metrics: dict) -> None:
        if not self.save_best:  # nothing to save (and runner.epoch would build the train loop)
            return super()._save_best_checkpoint(runner, metrics)
        unit, count = ('epoch', runner.epoch) if self.by_epoch else ('iter', runner.iter)
        if not refuse_nonfinite(runner,
                                f'{unit} {count} as a best checkpoint (its score is not compared)'):
            super()._save_best_checkpoint(runner, metrics)


@HOOKS.register_module()
class FiniteCheckpointHook(NonFiniteRefusal, CheckpointHook):
    """MMEngine's ``CheckpointHook`` that refuses a save with non-finite weights before it
    removes or records anything (:class:`NonFiniteRefusal`). ``DDPRunner`` uses it in place of
    ``CheckpointHook``; with MMEngine's ``Runner``, name it in ``default_hooks.checkpoint``."""


def finite_checkpoint_type(hook_type: Any) -> Any:
    """The type a ``default_hooks.checkpoint`` config gets instead of ``hook_type``:
    ``FiniteCheckpointHook`` for ``CheckpointHook``, a subclass of a project's own
    ``CheckpointHook`` subclass with :class:`NonFiniteRefusal` mixed in, and anything else
    (another hook, one that refuses already, a name not registered) unchanged."""
    cls = HOOKS.get(hook_type) if isinstance(hook_type, str) else hook_type
    if (not isinstance(cls, type) or not issubclass(cls, CheckpointHook)
            or issubclass(cls, NonFiniteRefusal)):
        return hook_type
    if cls is CheckpointHook:
        return FiniteCheckpointHook
    return type(f'Finite{cls.__name__}', (NonFiniteRefusal, cls), {})
