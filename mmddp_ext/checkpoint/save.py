"""What a checkpoint save refuses or reports: non-finite weights (refused before MMEngine's
``CheckpointHook`` removes or records anything) and a full disk (one line; the previous
checkpoint stays). docs/reliability.md, "Atomic checkpoints" and "Non-finite loss"."""
import errno
import itertools
import os.path as osp
from typing import Any, Callable, List, Optional, Tuple

import torch

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


def guard_checkpoint_hook(hook: Any, finite: Callable[[str], bool]) -> None:
    """Make MMEngine's ``CheckpointHook`` ask ``finite(what)`` before it changes anything.

    ``CheckpointHook`` removes the oldest checkpoint (``max_keep_ckpts``), the previous best
    one, and records ``last_ckpt``, ``best_score`` and ``best_ckpt`` in the message hub
    *before* it calls ``runner.save_checkpoint``, and writes ``last_checkpoint`` after it. A
    refusal inside ``save_checkpoint`` would leave all of that pointing at a file that was
    never written. So, on this hook instance, ``_save_checkpoint_with_step`` and
    ``_save_best_checkpoint`` first call ``finite``, which returns False (having logged why)
    to refuse: then nothing is removed, recorded or written.

    Args:
        hook: A ``CheckpointHook`` (or subclass) instance; guarded once.
        finite: ``finite(what) -> bool``, ``what`` naming the checkpoint for the log line.
    """
    if getattr(hook, '_mmddp_finite_guard', False):
        return
    save_with_step = hook._save_checkpoint_with_step
    save_best = hook._save_best_checkpoint

    def guarded_save_with_step(runner: Any, step: int, meta: dict) -> None:
        if finite(str(hook.filename_tmpl.format(step))):
            save_with_step(runner, step, meta)

    def guarded_save_best(runner: Any, metrics: dict) -> None:
        if not hook.save_best or not _improves(hook, runner, metrics):
            return save_best(runner, metrics)  # it saves and records nothing
        unit, count = ('epoch', runner.epoch) if hook.by_epoch else ('iter', runner.iter)
        if finite(f'a best checkpoint at {unit} {count} (its {", ".join(hook.key_indicators)} '
                  'is not recorded as best)'):
            save_best(runner, metrics)

    hook._save_checkpoint_with_step = guarded_save_with_step
    hook._save_best_checkpoint = guarded_save_best
    hook._mmddp_finite_guard = True


def _improves(hook: Any, runner: Any, metrics: dict) -> bool:
    """Whether ``CheckpointHook._save_best_checkpoint`` would save a new best checkpoint for
    ``metrics``, by the hook's own rules and the best score in the message hub (True while
    its rule is still ``'auto'``, i.e. not yet chosen)."""
    indicators = list(hook.key_indicators)
    if 'auto' in indicators:
        return True
    for key, rule in zip(indicators, hook.rules):
        best_key = 'best_score' if len(indicators) == 1 else f'best_score_{key}'
        best = runner.message_hub.runtime_info.get(best_key, hook.init_value_map[rule])
        score = metrics.get(key)
        if score is not None and hook.is_better_than[key](score, best):
            return True
    return False


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
