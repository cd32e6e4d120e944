"""A per-rank memory budget, ``scaling.memory_budget_mib``, that makes running out of memory
real and repeatable: an address-space limit on a CPU, a cap on this process's share of the
device on a GPU (:func:`apply_budget`); :func:`held_bytes` reads what it counts. Which errors
are out-of-memory errors: :mod:`mmddp_ext.oom.classify`; the ranks agree on a failure with
:func:`mmddp_ext.oom.ranks_out_of_memory.ranks_out_of_memory`. How the budget is enforced:
docs/scaling.md, 'Finding the per-device batch that fits', 'What is measured'.
"""
import contextlib
import ctypes
import ctypes.util
import os
import resource
from dataclasses import dataclass
from typing import Iterator, List, Optional

import torch

from ..gpu import gpus
from ..utils.memory_reads import address_space_bytes
from ..utils.units import MIB


@dataclass(frozen=True)
class Budget:
    """The memory one rank may use.

    Attributes:
        device: ``'cpu'`` or ``'cuda:N'``.
        nbytes: The budget in bytes (on a GPU without a configured budget: the free memory).
        how: One line for the log: what is measured and how the limit is enforced.
    """

    device: str
    nbytes: int
    how: str


M_MMAP_THRESHOLD, M_ARENA_MAX = -3, -8  # glibc's mallopt parameter numbers
# the share of a device's budget the batch finder's trials keep free for what training adds
# (and the out-of-memory advice assumes stays free)
MARGIN = 0.1
MMAP_THRESHOLD = 128 * 1024
# the RLIMIT_AS soft limit this process had before its CPU budget (set by apply_budget)
_LIMIT_BEFORE: List[int] = []


def _map_large_blocks() -> bool:
    """Make glibc return freed blocks of MMAP_THRESHOLD bytes or more to the system, and
    let threads started from now on share the existing heaps (each new heap reserves 64 MiB
    of address space, which the limit would count as used)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6')
        return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and libc.mallopt(M_ARENA_MAX, 1))
    except (OSError, AttributeError):  # not glibc: keep the allocator as it is
        return False


def _limit_address_space(nbytes: int) -> int:
    """Set ``RLIMIT_AS`` to the current virtual size + ``nbytes`` (never looser than now);
    return the room left under the limit."""
    _map_large_blocks()
    # oneDNN keeps kernels and buffers for every input shape it has seen (more address
    # space per batch size tried); without its cache every trial and step
    # starts from the same memory. Read by oneDNN when it first runs; a user's value wins.
    os.environ.setdefault('ONEDNN_PRIMITIVE_CACHE_CAPACITY', '0')
    # oneDNN does not survive a failed allocation: its convolution kernels crashed (a
    # segfault) or the thread could not create a primitive any more (mmddp_ext.oom.onednn);
    # torch's own kernels allocate through torch's allocator, which raises a clean error
    torch.backends.mkldnn.enabled = False
    vms = address_space_bytes()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = vms + nbytes
    for existing in (soft, hard):
        if existing != resource.RLIM_INFINITY:
            limit = min(limit, existing)
    if not _LIMIT_BEFORE:
        _LIMIT_BEFORE.append(soft)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    return max(0, limit - vms)


@contextlib.contextmanager
def checkpoint_writing() -> Iterator[None]:
    """Lift this process's CPU budget while a checkpoint is written, then put it back.

    A budget stands for a device's memory; on a GPU the checkpoint is serialized in host
    memory, which the device's budget does not count, and MMEngine serializes it into memory
    before writing (about twice the checkpoint: 168 MiB for the 128x128 demo with Adam). Under
    a CPU budget that left no room for it, the save failed after a whole epoch
    (``MemoryError`` in ``torch.save``). The limit the process had before the budget (a
    user's ``ulimit -v``) still holds. A no-op without a CPU budget."""
    if not _LIMIT_BEFORE:
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (_LIMIT_BEFORE[0], hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def apply_budget(budget_mib: Optional[int], device: torch.device) -> Optional[Budget]:
    """Enforce ``budget_mib`` for the rest of this process.

    On a CPU the budget is an address-space limit (``RLIMIT_AS`` = the process's size now + the
    budget), so torch's CPU allocator raises ``DefaultCPUAllocator: can't allocate memory`` once
    it is used up; oneDNN is turned off under it (it crashes or stays broken when an allocation
    fails: :mod:`mmddp_ext.oom.onednn`). An existing, tighter limit (``ulimit -v``) is
    kept. Threads and processes started later (dataloader workers) inherit the limit, measured
    from their own size. glibc and oneDNN are set so that the address space follows the memory
    in use (:func:`_limit_address_space`). On a GPU a budget caps this process's share of the device
    (``torch.cuda.set_per_process_memory_fraction``), so the caching allocator raises
    ``torch.OutOfMemoryError`` above it; without one nothing is capped.

    Args:
        budget_mib: The budget in MiB, or None.
        device: The device this rank trains on.

    Returns:
        The budget, or None on a CPU without one (there is nothing to measure against).
    """
    if device.type == 'cuda':
        g = gpus()
        index = device.index if device.index is not None else g.current()
        free, total = g.mem_get_info(index)
        name = g.name(index)
        if budget_mib is None:
            return Budget(
                f'cuda:{index}', free, f'GPU memory of cuda:{index} ({name}): '
                f'{free / MIB:.0f} MiB free of {total / MIB:.0f} MiB')
        fraction = min(1.0, budget_mib * MIB / total)
        g.set_memory_fraction(fraction, index)
        return Budget(
            f'cuda:{index}', min(free, budget_mib * MIB),
            f'GPU memory of cuda:{index} ({name}), capped at '
            f'scaling.memory_budget_mib={budget_mib} ({fraction:.1%} of the device)')
    if budget_mib is None:
        return None
    room = _limit_address_space(budget_mib * MIB)
    tighter = (f' (a tighter existing limit leaves {room / MIB:.0f} MiB)' if room < budget_mib *
               MIB else '')
    return Budget(
        'cpu', room, f'host memory (CPU run, no GPU measured): an address-space '
        f'limit of scaling.memory_budget_mib={budget_mib} MiB above the '
        f'process size{tighter}; other ranks on this host share the '
        f'same RAM; torch\'s own CPU kernels, not oneDNN\'s')


def held_bytes(device: torch.device) -> int:
    """What the budget counts as used by this process now: on a CPU its address space
    (``VmSize``, which ``RLIMIT_AS`` bounds), on a GPU the tensors torch has allocated on
    ``device`` (the caching allocator's free blocks are reused by the next step). The batch
    finder reads it between its trials and training after its first optimizer step, so that the
    two can be compared (docs/scaling.md, 'Finding the per-device batch that fits')."""
    if device.type == 'cuda':
        return gpus().allocated(device.index if device.index is not None else gpus().current())
    return address_space_bytes()
