"""The plain form of a checkpoint: ``HistoryBuffer`` objects, numpy arrays and numpy scalars
as marked dicts of tensors and plain values, so plain ``torch.load(path)`` opens what
``DDPRunner`` writes (docs/checkpoints.md, "Opened by plain ``torch.load(path)``").
Example::

    >>> plain = to_plain({'meta': {'best': np.float64(0.5)}})
    >>> plain['meta']['best']
    {'__mmddp_plain__': 'numpy.generic', 'dtype': '<f8', 'value': 0.5}
    >>> type(from_plain(plain)['meta']['best'])
    <class 'numpy.float64'>
"""
import copy
from typing import Any, Callable

import numpy as np
import torch
from mmengine.logging import HistoryBuffer

# The key that marks a dict written by to_plain; its value names what the dict stands for.
PLAIN_KEY = '__mmddp_plain__'
# Where to_plain keeps a meta.dataset_meta that held numpy values (MMPose's sigmas, colours):
# a reader without mmddp_ext then finds no dataset_meta, and MMPose's init_model takes the
# config's (the same types and values) instead of marked dicts. from_plain moves it back.
STORED_DATASET_META = 'mmddp_ext_dataset_meta'
_PLAIN_VALUES = (bool, int, float, str, bytes)


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


def _dataset_meta(checkpoint: Any) -> Any:
    meta = checkpoint.get('meta') if isinstance(checkpoint, dict) else None
    return meta.get('dataset_meta') if isinstance(meta, dict) else None


def _moved(checkpoint: Any, src: str, dst: str) -> Any:
    """``checkpoint`` with ``meta[src]`` renamed ``meta[dst]``, in its place among the keys
    (shallow copies of the top and of ``meta``); ``checkpoint`` itself when there is no
    ``meta[src]``."""
    meta = checkpoint.get('meta') if isinstance(checkpoint, dict) else None
    if not isinstance(meta, dict) or src not in meta:
        return checkpoint
    renamed = {(dst if key == src else key): value for key, value in meta.items()}
    meta = copy.copy(meta)
    meta.clear()
    meta.update(renamed)
    out = copy.copy(checkpoint)
    out['meta'] = meta
    return out


def to_plain(checkpoint: Any) -> Any:
    """The checkpoint with everything plain ``torch.load`` (``weights_only=True``) refuses
    and MMEngine puts there stored as tensors and plain Python values.

    Converted, wherever they are: ``HistoryBuffer`` (the message hub's ``log_scalars``),
    numpy arrays of numbers (as tensors) or text (as lists), numpy scalars (as Python
    numbers or text), each as a dict marked with :data:`PLAIN_KEY`. Other objects (arrays of
    Python objects, dates) are left as they are. The input is not changed.

    A ``meta.dataset_meta`` that held numpy values (MMPose's) is stored as
    ``meta[STORED_DATASET_META]``: tools that read ``meta.dataset_meta`` without mmddp_ext
    (MMPose's ``init_model``) would get marked dicts where arrays belong; without it they take
    the config's metainfo. One that needed no conversion (MMDetection's classes and palette)
    stays where it is.

    Args:
        checkpoint: what MMEngine's ``Runner.save_checkpoint`` is about to write.

    Returns:
        The converted checkpoint; ``checkpoint`` itself when there was nothing to convert.
    """
    plain = _map_leaves(checkpoint, _leaf_to_plain)
    if plain is checkpoint:
        return plain
    if _dataset_meta(plain) is _dataset_meta(checkpoint):  # absent, or nothing converted
        return plain
    return _moved(plain, 'dataset_meta', STORED_DATASET_META)


def from_plain(checkpoint: Any) -> Any:
    """Undo :func:`to_plain`: marked dicts become the original objects again (arrays with
    their dtype and memory order, scalars with their numpy type, history buffers with their
    values, counts and ``max_length``), and ``meta[STORED_DATASET_META]`` is
    ``meta.dataset_meta`` again. A checkpoint without marks (MMEngine's own format, plain
    weights) is returned as it is.

    Args:
        checkpoint: a loaded checkpoint.

    Returns:
        The restored checkpoint; ``checkpoint`` itself when there was nothing to restore.
    """
    return _map_leaves(_moved(checkpoint, STORED_DATASET_META, 'dataset_meta'), _leaf_from_plain)
