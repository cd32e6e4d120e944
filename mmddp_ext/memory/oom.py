"""Out-of-memory errors: the one classifier, releasing what a failed attempt left, and what
per-device batch would fit (the advice built on it: :mod:`mmddp_ext.diagnose.oom_advice`).

:func:`is_oom_error` (a live exception) and :func:`is_oom` (a failure record's type and
message) are the package's only out-of-memory predicates; :func:`release_memory` and
:func:`fitting_batch` follow. Which errors count, and how the batch that fits is found:
docs/memory.md, 'When a rank runs out of memory'.
"""
import re
import resource
from typing import Any, Iterator, Mapping, Optional, Tuple

from ..utils.units import BYTES_PER_UNIT, GIB, MIB, format_mib
from .budget import MARGIN

OOM_PATTERNS = ('out of memory', 'OutOfMemoryError', "can't allocate memory", 'DefaultCPUAllocator',
                'CUBLAS_STATUS_ALLOC_FAILED', 'std::bad_alloc', 'MemoryError',
                'Cannot allocate memory')
# Out-of-memory errors only under an address-space limit: oneDNN failing to allocate its
# workspace, and the dynamic loader failing to map a library (a budget too small to import).
LIMITED_PATTERNS = ('could not create a primitive', 'failed to map segment from shared object')
MAP_SEGMENT = LIMITED_PATTERNS[1]


def address_space_limit() -> Optional[int]:
    """This process's ``RLIMIT_AS`` soft limit in bytes, or None when unlimited."""
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def is_oom(exc_type: str, message: str, address_space_limited: bool = False) -> bool:
    """Whether an error, given by its type name and message, is an out-of-memory error.

    Args:
        exc_type: The exception's class name, e.g. ``'OutOfMemoryError'``.
        message: Its message.
        address_space_limited: Whether the process ran under an address-space limit (then
            :data:`LIMITED_PATTERNS` count too).
    """
    text = f'{exc_type}: {message}'.lower()
    patterns = OOM_PATTERNS + (LIMITED_PATTERNS if address_space_limited else ())
    return any(p.lower() in text for p in patterns)


def exception_chain(exc: Optional[BaseException]) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from (``__cause__``, else ``__context__``),
    each once."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def is_oom_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is an out-of-memory error; the
    address-space limit is read now, so call it where the error was raised."""
    limited = address_space_limit() is not None
    return any(
        isinstance(e, MemoryError) or any(
            c.__name__ == 'OutOfMemoryError'
            for c in type(e).__mro__) or is_oom(type(e).__name__, str(e), limited)
        for e in exception_chain(exc))


def drop_stale_backward_work(device: Any = None) -> None:
    """Let autograd drop what a failed backward left queued, on this thread and on the
    device's autograd thread.

    When a backward raises (an out-of-memory error in a kernel) while another node of the same
    graph is ready (a residual block's shortcut beside its main branch), the engine leaves that
    node's task in the thread's ready queue: its incoming gradient and, through the node, the
    rest of the graph with its saved activations (measured on the demo model: 87 MiB of a
    146 MiB step, docs/memory.md). ``gc.collect()`` cannot reach it; the engine drops such
    tasks, their graph being gone, when the queue is next used. A one-element backward on the
    calling thread (a CPU graph's queue) and, for a CUDA ``device``, one on that device (its
    own autograd thread and queue) is that next use.

    Args:
        device: The device the failed step ran on (a ``torch.device`` or None for the CPU).
    """
    import torch

    with torch.inference_mode(False), torch.enable_grad():
        torch.zeros((), requires_grad=True).mul(1.0).backward()
        if device is not None and torch.device(device).type == 'cuda':
            torch.zeros((), device=device, requires_grad=True).mul(1.0).backward()


def release_memory(device: Any = None) -> None:
    """Give back what a failed attempt left: the autograd work a failed backward left queued
    (:func:`drop_stale_backward_work`), reference cycles through its traceback's frames and,
    where this process has a GPU context, the caching allocator's free blocks.

    Args:
        device: The device the attempt ran on (None: the CPU).
    """
    import gc

    from ..gpu import gpus
    drop_stale_backward_work(device)
    gc.collect()
    gpus().empty_cache()


def memory_reading(device: Any = None) -> str:
    """This process's memory now, for a debug line around an out-of-memory error: on a CPU
    its address space (``VmSize``, what a budget limits) and resident set; on a GPU torch's
    allocated and reserved bytes on ``device``."""
    import torch

    from ..gpu import gpus
    from ..utils.process import address_space_bytes, rss_bytes
    host = f'VmSize {format_mib(address_space_bytes())}, RSS {format_mib(rss_bytes())}'
    if device is None or torch.device(device).type != 'cuda':
        return host
    index = torch.device(device).index
    index = gpus().current() if index is None else index
    return (f'cuda:{index} allocated {format_mib(gpus().allocated(index))}, reserved '
            f'{format_mib(gpus().reserved(index))}; {host}')


def requested_bytes(message: str) -> Optional[int]:
    """The size of the failed allocation, from torch's CUDA or CPU message."""
    m = re.search(r'you tried to allocate (\d+) bytes', message)
    if m:
        return int(m.group(1))
    m = re.search(r'Tried to allocate ([\d.]+) (B|KiB|MiB|GiB|TiB)', message)
    if m:
        return int(float(m.group(1)) * BYTES_PER_UNIT[m.group(2).lower()])
    return None


def fitting_batch(batch: int, baseline: Mapping[str, Any], peak: Mapping[str, Any],
                  requested: Optional[int]) -> Tuple[int, str]:
    """The per-device batch that would fit, and how it was found: on a GPU from the measured
    memory per sample (peak allocated + ``requested`` - baseline, over ``batch``) and what 90%
    of the device, less other processes, leaves above the baseline; on a CPU half the batch,
    a rule of thumb. Always between 1 and ``batch - 1`` (1 when ``batch`` is 1)."""
    total = peak.get('device_total')
    if total and peak.get('peak_allocated') is not None and baseline.get('allocated') is not None:
        base = baseline['allocated']
        need = max(peak['peak_allocated'] + (requested or 0) - base, 1)
        per_sample = need / batch
        others = max(0, (peak.get('device_used') or 0) - (peak.get('reserved') or 0))
        room = (1 - MARGIN) * (total - others) - base
        fit = int(room // per_sample)
        return max(
            1, min(batch - 1,
                   fit)), (f'measured: {per_sample / MIB:.1f} MiB per sample above a baseline of '
                           f'{format_mib(base)}, {total / GIB:.2f} GiB device, 10% margin')
    return max(1, batch // 2), ('rule of thumb (no device total on a CPU): half the per-device '
                                'batch; the limit was the host memory available to the process')
