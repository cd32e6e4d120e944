"""What a checkpoint save refuses or reports: non-finite weights (the check that
:class:`~mmddp_ext.hooks.finite_checkpoint_hook.FiniteCheckpointHook` and ``DDPRunner`` make
before a save), and a full disk or a folder that refuses new files (one line each; the previous
checkpoint stays). docs/checkpoints.md,
"Atomic" and "Never with non-finite weights"."""
import errno
import itertools
import os.path as osp
import shutil
from typing import Any, List, Optional, Tuple

import torch
from mmengine.model import is_model_wrapper

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


# a folder that stopped taking files: permissions, read-only (a remount, an export's rules), an
# immutable folder, a folder removed under the run
REFUSED = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT)


def refused_save_error(error: OSError, path: str, previous: Optional[str]) -> OSError:
    """The one-line error for a checkpoint save that its folder refused (pure formatting).

    Args:
        error: the ``OSError`` the write raised (EACCES, EPERM, EROFS or ENOENT).
        path: the checkpoint that was being written.
        previous: the previous checkpoint (``last_checkpoint``), if there is one.
    """
    folder = osp.dirname(path)
    kept = (f'the previous checkpoint {previous} is intact'
            if previous else 'no earlier checkpoint')
    resume = f'--resume {previous}' if previous else '--resume'
    return OSError(
        error.errno, f'the work dir refused checkpoint {path}: {error.strerror} '
        f'({error.filename or folder}); {kept}, no partial file was left\nfix: let {folder} '
        'take new files again (its permissions, a read-only mount, `lsattr -d` for an immutable '
        f'folder, the export\'s or quota\'s rules), or give a --work-dir that does, then {resume}')


def previous_checkpoint(out_dir: str) -> Optional[str]:
    """The checkpoint ``last_checkpoint`` in ``out_dir`` names, when that file exists."""
    try:
        with open(osp.join(out_dir, 'last_checkpoint')) as f:
            path = f.read().strip()
    except OSError:
        return None
    return path if path and osp.exists(path) else None


def save_error(error: BaseException, path: str) -> Optional[OSError]:
    """The one-line error for a local checkpoint save at ``path`` that failed with ``error``:
    :func:`disk_full_error` (with the disk's free space) or :func:`refused_save_error`, both
    naming the previous checkpoint; None for any other error (raised as it is)."""
    if not isinstance(error, OSError) or error.errno not in DISK_FULL + REFUSED:
        return None
    folder = osp.dirname(path)
    previous = previous_checkpoint(folder)
    if error.errno in REFUSED:
        return refused_save_error(error, path, previous)
    try:
        usage = shutil.disk_usage(folder)
    except OSError:
        return disk_full_error(error, path, None, previous)
    return disk_full_error(error, path, (usage.free, usage.total), previous)
