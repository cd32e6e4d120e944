"""Out-of-memory errors: the one classifier, releasing what a failed attempt left, and what
per-device batch would fit.

:func:`is_oom_error` (a live exception) and :func:`is_oom` (a failure record's type and
message) are the only out-of-memory predicates of the package: the batch finder,
``on_oom='microbatch'``, the failure records and ``python -m mmddp_ext.diagnose`` all use them.
They recognise torch's CUDA and CPU allocators, ``MemoryError``, ``std::bad_alloc``, and, when
the address space is limited (``scaling.memory_budget_mib`` on a CPU, ``ulimit -v``), oneDNN's
"could not create a primitive" and the loader's "failed to map segment from shared object"
(outside such a limit those two mean something else).

The advice keeps the global batch: a smaller per-device batch is paid for with gradient
accumulation, so the recipe (and the LR) stay as they are.

* On a GPU the fit is computed from measured numbers: the memory held before the first step
  (model, optimizer, CUDA context: ``baseline``) and the peak while training at the per-device
  batch ``B`` give the memory per sample ``(peak - baseline) / B``; what fits is what the
  device's total (less other processes, less a 10% margin) leaves for samples.
* On a CPU (a host memory limit) there is no device total to compare with: the advice halves the
  per-device batch, and says that this is a rule of thumb, not a measurement.
"""
import re
import resource
from typing import Any, List, Mapping, Optional, Tuple

from ..scaling.split import best_split
from ..utils.units import GIB, MIB, format_mib
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


def is_oom_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is an out-of-memory error; the
    address-space limit is read now, so call it where the error was raised."""
    limited = address_space_limit() is not None
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, MemoryError) or any(c.__name__ == 'OutOfMemoryError'
                                               for c in type(exc).__mro__):
            return True
        if is_oom(type(exc).__name__, str(exc), limited):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def release_memory() -> None:
    """Release what a failed attempt left: reference cycles through its traceback's frames
    and, where this process has a GPU context, the caching allocator's free blocks."""
    import gc

    from ..gpu import gpus
    gc.collect()
    gpus().empty_cache()


def requested_bytes(message: str) -> Optional[int]:
    """The size of the failed allocation, from torch's CUDA or CPU message."""
    m = re.search(r'you tried to allocate (\d+) bytes', message)
    if m:
        return int(m.group(1))
    m = re.search(r'Tried to allocate ([\d.]+) (B|KiB|MiB|GiB|TiB)', message)
    if m:
        scale = {'B': 1, 'KiB': 2**10, 'MiB': 2**20, 'GiB': 2**30, 'TiB': 2**40}
        return int(float(m.group(1)) * scale[m.group(2)])
    return None


def fitting_batch(batch: int, baseline: Mapping[str, Any], peak: Mapping[str, Any],
                  requested: Optional[int]) -> Tuple[int, str]:
    """The per-device batch that would fit, and how it was found."""
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


def _nothing_fits(record: Mapping[str, Any]) -> Optional[List[str]]:
    """Advice when what was measured shows that no per-device batch fits, else None."""
    budget = record.get('memory_budget_mib')
    budget_text = (f'scaling.memory_budget_mib={budget}'
                   if budget is not None else 'the memory available to the process')
    if MAP_SEGMENT in record.get('message', ''):
        return [
            f'cause: out of memory while loading a library: {budget_text} leaves too '
            f'little address space to import the training stack, before any batch ran',
            'fix: raise scaling.memory_budget_mib (it is counted above the process size '
            'when it is applied), or remove the budget (or the ulimit -v) that limits it'
        ]
    if record.get('oom_at_batch') == 1:
        lines = [
            f'cause: out of memory even with micro-batches of 1 sample (measured by '
            f"scaling.on_oom='microbatch'): no per-device batch fits within {budget_text}",
            'fix: raise scaling.memory_budget_mib, or train on a device with more memory, '
            'a smaller model or a smaller input size'
        ]
        finder = record.get('finder')
        if finder:
            lines.insert(
                1, f'measured wrong: the batch finder measured per-device batch '
                f'{finder["max_batch"]} to fit with {format_mib(finder["reserve"])} kept free '
                f'for what training adds; at the failure this rank held '
                f'{format_mib(max(finder["extra"], 0))} beyond what it held between the trials')
        return lines
    return None


def oom_advice(record: Mapping[str, Any]) -> List[str]:
    """Lines of advice for an OOM failure record (see :mod:`mmddp_ext.diagnose.records`).

    The advice follows what was measured: ``oom_at_batch`` (the smallest per-device batch or
    micro-batch that ran out of memory, from ``on_oom='microbatch'``) is used instead of the
    planned batch when present, and a record that shows that nothing fits says so instead of
    suggesting a batch.
    """
    stuck = _nothing_fits(record)
    if stuck is not None:
        return stuck
    plan = record.get('plan') or {}
    memory = record.get('memory') or {}
    batch = plan.get('per_device_batch_size') or record.get('per_device_batch_size')
    if not batch:
        return [
            'cause: out of memory. Lower train_dataloader.batch_size (per device) and raise '
            'optim_wrapper.accumulative_counts to keep the global batch.'
        ]
    world = plan.get('world_size') or 1
    accum = plan.get('accumulative_counts') or 1
    global_batch = plan.get('global_batch_size') or batch * world * accum
    peak = memory.get('last') or memory.get('now') or {}
    failed = min(batch, record.get('oom_at_batch') or batch)
    fit, how = fitting_batch(failed,
                             memory.get('baseline') or {}, peak,
                             requested_bytes(record.get('message', '')))
    per_device, k = best_split(global_batch, world, fit)  # global is world-divisible
    at = f'micro-batches of {failed} of per-device batch {batch}' if failed < batch else (
        f'per-device batch {batch}')
    lines = [
        f'cause: out of memory at {at} ({batch} × {world} × '
        f'accumulation {accum} = global {global_batch})',
        f'fit: per-device batch {per_device} × {world} × accumulation {k} keeps the global '
        f'batch {global_batch} ({how})',
        f'fix: --cfg-options scaling.max_batch_per_device={per_device}   (DDPRunner), or '
        f'train_dataloader.batch_size={per_device} optim_wrapper.accumulative_counts={k}'
    ]
    lines.append('or: scaling.max_batch_per_device=auto measures the batch that fits on every '
                 'rank before training (on a CPU with scaling.memory_budget_mib), and '
                 'scaling.on_oom=microbatch redoes such a step as smaller micro-batches')
    if record.get('gradient_as_bucket_view') is False:
        lines.append('also: gradient_as_bucket_view is off: DDP keeps a second copy of the '
                     'gradients; model_wrapper_cfg.gradient_as_bucket_view=True saves it')
    for finding in record.get('stray_findings') or []:
        lines.append(f'stray: {finding}')
    return lines
