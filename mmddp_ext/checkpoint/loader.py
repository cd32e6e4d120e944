"""The local checkpoint loader: ``weights_only=True`` on torch >= 2.6 with exactly MMEngine's
own types allowed, and an explicit opt-in for legacy checkpoints (docs/checkpoints.md, "Safe
to load")."""
import os
import os.path as osp
import pickle
import warnings
from typing import Any, Callable, List, Optional, Union

import numpy as np
import torch
from mmengine.logging import HistoryBuffer
from mmengine.runner import CheckpointLoader

from .plain import from_plain

UNSAFE_ENV = 'MMDDP_UNSAFE_LOAD'
_HISTORY_METHODS = ('min', 'max', 'current', 'mean')


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
