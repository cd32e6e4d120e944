"""A DataLoader worker that cannot hand its batch over through shared memory raises, in its rank.

Where /dev/shm is full, torch's queue feeder thread prints "unable to allocate shared memory",
drops the batch, and the rank waits for it forever. Here the worker moves the collated batch's
tensors into shared memory itself, as PyTorch's ``default_collate`` does in a worker: the
feeder then allocates nothing, and a failure is the worker's own error, raised again in the
rank, whose diagnosis names /dev/shm, its size and the fixes.
"""
import functools
import os
import socket
from typing import Any, Iterator

import torch
from torch.utils.data import get_worker_info

from ..node.facts import shm_free, shm_size
from ..utils.units import format_bytes

SHM = '/dev/shm'  # where torch's shared memory lives on Linux (shm_open)
MESSAGE = 'could not hand its batch to its rank through shared memory'  # the diagnosis's key
_DEPTH = 8  # a batch's containers and data samples nest a few levels deep


class SharedBatches(functools.partial):
    """A ``collate_fn`` that, in a DataLoader worker, moves the collated batch's CPU tensors
    into shared memory (:func:`share_batch`); in the rank itself (no workers) it only collates.

    It is the :class:`functools.partial` MMEngine's ``build_dataloader`` makes, with the same
    ``.func``, ``.args`` and ``.keywords``, and it pickles with every multiprocessing start
    method.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        batch = super().__call__(*args, **kwargs)
        info = get_worker_info()
        if info is not None:
            share_batch(batch, info.id)
        return batch


def share_batch(batch: Any, worker_id: int = 0) -> Any:
    """Move every CPU tensor of ``batch`` (in lists, tuples, dicts and objects' attributes,
    MMEngine's data samples included) into shared memory; returns ``batch``.

    Raises:
        RuntimeError: one line that names /dev/shm, its size, what is free, the batch's size
            and the fixes, where shared memory cannot hold the batch.
    """
    tensors = [t for t in _tensors(batch, _DEPTH, set()) if t.device.type == 'cpu']
    try:
        for tensor in tensors:
            tensor.share_memory_()  # no-op where it is there already (default_collate's)
    except RuntimeError as e:
        if 'shared memory' not in str(e) and 'No space left' not in str(e):
            raise
        need = sum(t.untyped_storage().nbytes() for t in tensors)
        raise RuntimeError(
            shm_full_message(worker_id, need, shm_size(SHM), shm_free(SHM),
                             str(e).strip().splitlines()[-1])) from None
    return batch


def shm_full_message(worker_id: int, batch_bytes: int, size, free, torch_said: str) -> str:
    """The worker's one-line error (the diagnosis shows a worker's last line)."""

    def amount(n):
        return '?' if n is None else format_bytes(n)

    return (f'DataLoader worker {worker_id} (pid {os.getpid()}) {MESSAGE}: {SHM} on host '
            f'{socket.gethostname()} has {amount(size)}, {amount(free)} free, for a batch of '
            f'{format_bytes(batch_bytes)} (torch: {torch_said})')


def _tensors(obj: Any, depth: int, seen: set) -> Iterator[torch.Tensor]:
    """The tensors in ``obj``, each once."""
    if isinstance(obj, torch.Tensor):
        yield obj
        return
    if depth == 0 or isinstance(obj, (str, bytes, int, float, bool, type(None))) or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, dict):
        children = obj.values()
    elif isinstance(obj, (list, tuple, set)):
        children = obj
    else:
        children = getattr(obj, '__dict__', {}).values()
    for child in list(children):
        yield from _tensors(child, depth - 1, seen)


def share_batches(dataloader: Any) -> Any:
    """Give ``dataloader`` (before its workers start) a :class:`SharedBatches` collate function
    where it has workers and its collate function is a ``functools.partial`` (as MMEngine
    builds every one from a config); returns it. A collate function given as another callable
    is kept as it is (MMEngine returns that very object), and its workers hand their batches
    over as torch does."""
    collate = getattr(dataloader, 'collate_fn', None)
    if (getattr(dataloader, 'num_workers', 0) and isinstance(collate, functools.partial)
            and not isinstance(collate, SharedBatches)):
        dataloader.collate_fn = SharedBatches(collate.func, *collate.args, **collate.keywords)
    return dataloader
