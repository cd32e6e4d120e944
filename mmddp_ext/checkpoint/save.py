"""What a checkpoint save refuses or reports: non-finite weights (refused before MMEngine's
``CheckpointHook`` removes or records anything: :class:`FiniteCheckpointHook`) and a full disk
(one line; the previous checkpoint stays). docs/reliability.md, "Atomic checkpoints" and
"Non-finite loss"."""
import errno
import itertools
import os.path as osp
from typing import Any, List, Optional, Tuple

import torch
from mmengine.hooks import CheckpointHook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS

from ..utils.tensors import nonfinite_indices
from ..utils.units import format_mib


def nonfinite_tensors(model: torch.nn.Module) -> Tuple[List[str], int]:
    """The floating-point parameters and buffers of ``model`` that hold a NaN or Inf.

    One device-to-host copy in all, no collective. Under DDP every rank holds the same
    weights, so every rank reaches the same answer.

    Returns:
        Their names (in ``named_parameters`` then ``named_buffers`` order) and the number of
        floating-point tensors checked.
    """
    tensors = [(name, t)
               for name, t in itertools.chain(model.named_parameters(), model.named_buffers())
               if t.is_floating_point()]
    bad = nonfinite_indices([t for _, t in tensors])
    return [tensors[i][0] for i in bad], len(tensors)


def refusal_message(what: str, bad: List[str], total: int) -> str:
    """The one line that says a save was refused: ``what``, how many tensors are not finite
    and the first three names."""
    shown = ', '.join(bad[:3]) + (', ...' if len(bad) > 3 else '')
    return (f'[mmddp_ext] refusing to save {what}: {len(bad)} of {total} weight tensors are '
            f'not finite ({shown}); earlier checkpoints are kept')


def refuse_nonfinite(runner: Any, what: str) -> bool:
    """Whether ``runner``'s model holds a NaN or Inf weight; if so, log that ``what`` (a
    checkpoint) is not saved, naming the first tensors. The same answer on every rank (DDP
    keeps the weights equal); no collective."""
    model = runner.model.module if is_model_wrapper(runner.model) else runner.model
    bad, total = nonfinite_tensors(model)
    if bad:
        runner.logger.warning(refusal_message(what, bad, total))
    return bool(bad)


class RefuseNonFinite:
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
class FiniteCheckpointHook(RefuseNonFinite, CheckpointHook):
    """MMEngine's ``CheckpointHook`` that refuses a save with non-finite weights before it
    removes or records anything (:class:`RefuseNonFinite`). ``DDPRunner`` uses it in place of
    ``CheckpointHook``; with MMEngine's ``Runner``, name it in ``default_hooks.checkpoint``."""


def finite_checkpoint_type(hook_type: Any) -> Any:
    """The type a ``default_hooks.checkpoint`` config gets instead of ``hook_type``:
    ``FiniteCheckpointHook`` for ``CheckpointHook``, a subclass of a project's own
    ``CheckpointHook`` subclass with :class:`RefuseNonFinite` mixed in, and anything else
    (another hook, one that refuses already, a name not registered) unchanged."""
    cls = HOOKS.get(hook_type) if isinstance(hook_type, str) else hook_type
    if (not isinstance(cls, type) or not issubclass(cls, CheckpointHook)
            or issubclass(cls, RefuseNonFinite)):
        return hook_type
    if cls is CheckpointHook:
        return FiniteCheckpointHook
    return type(f'Finite{cls.__name__}', (RefuseNonFinite, cls), {})


DISK_FULL = (errno.ENOSPC, getattr(errno, 'EDQUOT', errno.ENOSPC))


def disk_full_error(error: OSError, path: str, usage: Optional[Tuple[int, int]],
                    previous: Optional[str]) -> OSError:
    """The one-line error for a checkpoint save that ran out of space (pure formatting).

    Args:
        error: the ``OSError`` the write raised (ENOSPC, or EDQUOT for a quota).
        path: the checkpoint that was being written.
        usage: ``(free, total)`` bytes of its disk (``shutil.disk_usage``), or None.
        previous: the previous checkpoint (``last_checkpoint``), if there is one.
    """
    what = 'disk quota exceeded' if error.errno != errno.ENOSPC else 'no space left on device'
    space = (''
             if usage is None else f': {format_mib(usage[0])} free of {format_mib(usage[1])} there')
    kept = (f'the previous checkpoint {previous} is intact'
            if previous else 'no earlier checkpoint')
    return OSError(
        error.errno, f'{what} while saving checkpoint {path}{space}; {kept}, no partial '
        'file was left\nfix: free space there, keep fewer checkpoints '
        '(--cfg-options default_hooks.checkpoint.max_keep_ckpts=2), or give a --work-dir on '
        'a larger disk, then --resume')


def previous_checkpoint(out_dir: str) -> Optional[str]:
    """The checkpoint ``last_checkpoint`` in ``out_dir`` names, when that file exists."""
    try:
        with open(osp.join(out_dir, 'last_checkpoint')) as f:
            path = f.read().strip()
    except OSError:
        return None
    return path if path and osp.exists(path) else None
