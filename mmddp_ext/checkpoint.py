"""Checkpoints: MMEngine's local loader replaced by one that keeps ``weights_only=True`` on
torch >= 2.6 and allows exactly MMEngine's own types (:func:`register_safe_loader`; an
explicit opt-in for legacy ones, :data:`UNSAFE_ENV`), the plain form that plain
``torch.load(path)`` opens (:func:`to_plain`, :func:`from_plain`), and the refusal to save
non-finite weights (:func:`nonfinite_tensors`, :func:`guard_checkpoint_hook`).

Why and what is converted: docs/reliability.md ("Safe loading", "Checkpoints that plain
``torch.load`` opens"). Example::

    >>> plain = to_plain({'meta': {'best': np.float64(0.5)}})
    >>> plain['meta']['best']
    {'__mmddp_plain__': 'numpy.generic', 'dtype': '<f8', 'value': 0.5}
    >>> type(from_plain(plain)['meta']['best'])
    <class 'numpy.float64'>
"""
import copy
import errno
import itertools
import os
import os.path as osp
import pickle
import warnings
from typing import Any, Callable, List, Optional, Tuple, Union

import numpy as np
import torch
from mmengine.logging import HistoryBuffer
from mmengine.runner import CheckpointLoader

from .utils.units import format_mib

UNSAFE_ENV = 'MMDDP_UNSAFE_LOAD'
_HISTORY_METHODS = ('min', 'max', 'current', 'mean')
# The key that marks a dict written by to_plain; its value names what the dict stands for.
PLAIN_KEY = '__mmddp_plain__'
_PLAIN_VALUES = (bool, int, float, str, bytes)


def _history_buffer_getattr(obj: Any, name: str) -> Any:
    """Stands in for ``getattr`` while unpickling: ``HistoryBuffer`` pickles its statistics
    methods as ``getattr(HistoryBuffer, 'mean')``; any other use is refused."""
    if obj is HistoryBuffer and (name in _HISTORY_METHODS
                                 or name in HistoryBuffer._statistics_methods):
        return getattr(obj, name)
    raise pickle.UnpicklingError(f'checkpoint asks for getattr({obj!r}, {name!r}); only '
                                 'HistoryBuffer statistics methods are allowed')


def safe_globals() -> List[Any]:
    """Types besides tensors that MMEngine / MMPose / MMDetection checkpoints hold."""
    try:  # numpy >= 2
        from numpy._core.multiarray import _reconstruct, scalar
    except ImportError:  # numpy 1.x
        from numpy.core.multiarray import _reconstruct, scalar
    dtype_classes = [
        type(np.dtype(t))
        for t in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
                  np.uint64, np.float16, np.float32, np.float64, np.str_, np.bytes_)
    ]
    return [
        _reconstruct, scalar, np.ndarray, np.dtype, *dtype_classes, HistoryBuffer,
        (_history_buffer_getattr, 'builtins.getattr')
    ]


def load_checkpoint_file(filename: str, map_location: Optional[Union[str, Callable,
                                                                     torch.device]] = None) -> Any:
    """``torch.load`` a local checkpoint with ``weights_only=True`` and our allowlist.

    ``map_location=None`` means CPU here, never "the device it was saved from".

    Returns:
        The checkpoint, with what :func:`to_plain` converted given back (:func:`from_plain`).

    Raises:
        FileNotFoundError: the file does not exist.
        RuntimeError: the checkpoint holds a type outside the allowlist (named in the message).
    """
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise FileNotFoundError(f'checkpoint {filename!r} does not exist')
    if os.environ.get(UNSAFE_ENV) == '1':
        warnings.warn(
            f'{UNSAFE_ENV}=1: loading {filename!r} with weights_only=False; '
            'unpickling can run any code the file contains. Only do this for '
            'checkpoints you trust.', stacklevel=2)
        return from_plain(
            torch.load(filename, map_location=map_location or 'cpu', weights_only=False))
    if map_location is None:
        # torch would restore tensors to the device they were saved from (often cuda:0): on
        # another rank that is a stray CUDA context on GPU 0. Load to CPU instead.
        map_location = 'cpu'
    try:
        with torch.serialization.safe_globals(safe_globals()):
            return from_plain(torch.load(filename, map_location=map_location, weights_only=True))
    except Exception as e:  # torch raises UnpicklingError wrapped in various types
        if 'Weights only load failed' not in str(e):
            raise
        raise RuntimeError(
            f'refusing to load checkpoint {filename!r}: it holds a Python object that is not '
            'in mmddp_ext\'s allowlist of checkpoint types, and unpickling it could run code. '
            f'torch said: {_unsupported_global(str(e))}. If you trust this file: --unsafe-load '
            f'(or unsafe_load = True in the config, or {UNSAFE_ENV}=1)') from e


def _unsupported_global(message: str) -> str:
    """The part of torch's weights-only error that names the refused type or call."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    for line in lines:
        if 'unsupported global' in line.lower():
            return line
    for i, line in enumerate(lines):
        if 'WeightsUnpickler error:' in line:
            rest = line.split('WeightsUnpickler error:', 1)[1].strip()
            return rest or (lines[i + 1] if i + 1 < len(lines) else line)
    return lines[0] if lines else '(no message)'


def load_from_local_safe(filename: str, map_location=None) -> Any:
    """MMEngine checkpoint scheme for local paths (the name must start with ``load_from_``)."""
    return load_checkpoint_file(filename, map_location)


def register_safe_loader() -> None:
    """Make MMEngine load local checkpoints through :func:`load_checkpoint_file`."""
    CheckpointLoader.register_scheme(prefixes='', loader=load_from_local_safe, force=True)


def _array_to_plain(array: np.ndarray) -> Any:
    """A marked dict holding the array's values as a tensor (numbers) or nested lists (text);
    arrays of other kinds (objects, records, dates) are returned as they are."""
    if array.dtype.kind in 'biufc':
        try:
            data = torch.from_numpy(np.array(array, dtype=array.dtype.newbyteorder('='), order='C'))
        except TypeError:  # a dtype torch has no tensor for, e.g. float128
            return array
    elif array.dtype.kind in 'US':
        data = array.tolist()
    else:
        return array
    fortran = bool(array.flags.f_contiguous and not array.flags.c_contiguous)
    return {PLAIN_KEY: 'numpy.ndarray', 'dtype': array.dtype.str, 'fortran': fortran, 'data': data}


def _array_from_plain(plain: dict) -> np.ndarray:
    data = plain['data']
    if isinstance(data, torch.Tensor):
        data = data.detach().cpu().numpy()
    array = np.array(data, dtype=np.dtype(plain['dtype']))
    return np.asfortranarray(array) if plain.get('fortran') else array


def _leaf_to_plain(obj: Any) -> Any:
    """The plain form of a HistoryBuffer, numpy array or numpy scalar; anything else as is."""
    if type(obj) is HistoryBuffer:
        return {
            PLAIN_KEY: 'HistoryBuffer',
            'max_length': obj.max_length,
            'log_history': _leaf_to_plain(obj.data[0]),
            'count_history': _leaf_to_plain(obj.data[1])
        }
    if isinstance(obj, np.ndarray):
        return _array_to_plain(obj)
    if isinstance(obj, np.generic):
        value = obj.item()
        if type(value) not in _PLAIN_VALUES:  # dates, long doubles, complex numbers
            return obj
        return {PLAIN_KEY: 'numpy.generic', 'dtype': obj.dtype.str, 'value': value}
    return obj


def _leaf_from_plain(obj: Any) -> Any:
    """The object that :func:`_leaf_to_plain` made ``obj`` from; anything else as is."""
    if type(obj) is not dict or PLAIN_KEY not in obj:
        return obj
    kind = obj[PLAIN_KEY]
    if kind == 'numpy.ndarray':
        return _array_from_plain(obj)
    if kind == 'numpy.generic':
        return np.dtype(obj['dtype']).type(obj['value'])
    if kind == 'HistoryBuffer':
        return HistoryBuffer(
            _leaf_from_plain(obj['log_history']), _leaf_from_plain(obj['count_history']),
            obj['max_length'])
    return obj


def _map_leaves(obj: Any, leaf: Callable[[Any], Any]) -> Any:
    """``obj`` with ``leaf`` applied to every value inside dicts, lists and tuples. Containers
    in which nothing changed are returned as they are (no copy); changed ones are shallow
    copies of the same type, so an OrderedDict keeps its ``_metadata``."""
    new = leaf(obj)
    if new is not obj:
        return new
    if isinstance(obj, dict):
        items = {key: _map_leaves(value, leaf) for key, value in obj.items()}
        if all(items[key] is value for key, value in obj.items()):
            return obj
        out = copy.copy(obj)
        for key, value in items.items():
            out[key] = value
        return out
    if type(obj) in (list, tuple):
        values = [_map_leaves(value, leaf) for value in obj]
        if all(a is b for a, b in zip(values, obj)):
            return obj
        return type(obj)(values)
    return obj


def to_plain(checkpoint: Any) -> Any:
    """The checkpoint with everything plain ``torch.load`` (``weights_only=True``) refuses
    and MMEngine puts there stored as tensors and plain Python values.

    Converted, wherever they are: ``HistoryBuffer`` (the message hub's ``log_scalars``),
    numpy arrays of numbers (as tensors) or text (as lists), numpy scalars (as Python
    numbers or text), each as a dict marked with :data:`PLAIN_KEY`. Other objects (arrays of
    Python objects, dates) are left as they are. The input is not changed.

    Args:
        checkpoint: what MMEngine's ``Runner.save_checkpoint`` is about to write.

    Returns:
        The converted checkpoint; ``checkpoint`` itself when there was nothing to convert.
    """
    return _map_leaves(checkpoint, _leaf_to_plain)


def from_plain(checkpoint: Any) -> Any:
    """Undo :func:`to_plain`: marked dicts become the original objects again (arrays with
    their dtype and memory order, scalars with their numpy type, history buffers with their
    values, counts and ``max_length``). A checkpoint without marks (MMEngine's own format,
    plain weights) is returned as it is.

    Args:
        checkpoint: a loaded checkpoint.

    Returns:
        The restored checkpoint; ``checkpoint`` itself when there was nothing to restore.
    """
    return _map_leaves(checkpoint, _leaf_from_plain)


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
    if not tensors:
        return [], 0
    device = tensors[0][1].device
    flags = torch.stack([torch.isfinite(t).all().to(device) for _, t in tensors]).cpu()
    return [name for (name, _), ok in zip(tensors, flags.tolist()) if not ok], len(tensors)


def refusal(what: str, bad: List[str], total: int) -> str:
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
