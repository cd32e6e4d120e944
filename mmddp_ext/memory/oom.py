"""Out-of-memory errors: recognise them and say what per-device batch would fit (pure).

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
from typing import Any, List, Mapping, Optional, Tuple

from ..scaling.plan import best_split
from ..scaling.search import MARGIN

OOM_PATTERNS = ('out of memory', 'OutOfMemoryError', "can't allocate memory",
                'DefaultCPUAllocator', 'CUBLAS_STATUS_ALLOC_FAILED', 'std::bad_alloc')


def is_oom(exc_type: str, message: str) -> bool:
    """Whether a failure record describes an out-of-memory error."""
    text = f'{exc_type}: {message}'
    return any(p.lower() in text.lower() for p in OOM_PATTERNS)


def requested_bytes(message: str) -> Optional[int]:
    """The size of the failed allocation, from torch's CUDA or CPU message."""
    m = re.search(r'you tried to allocate (\d+) bytes', message)
    if m:
        return int(m.group(1))
    m = re.search(r'Tried to allocate ([\d.]+) (B|KiB|MiB|GiB|TiB)', message)
    if m:
        scale = {'B': 1, 'KiB': 2 ** 10, 'MiB': 2 ** 20, 'GiB': 2 ** 30, 'TiB': 2 ** 40}
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
        return max(1, min(batch - 1, fit)), (
            f'measured: {per_sample / 2 ** 20:.1f} MiB per sample above a baseline of '
            f'{base / 2 ** 20:.0f} MiB, {total / 2 ** 30:.2f} GiB device, 10% margin')
    return max(1, batch // 2), ('rule of thumb (no device total on a CPU): half the per-device '
                                'batch; the limit was the host memory available to the process')


def oom_advice(record: Mapping[str, Any]) -> List[str]:
    """Lines of advice for an OOM failure record (see :mod:`mmddp_ext.failures`)."""
    plan = record.get('plan') or {}
    memory = record.get('memory') or {}
    batch = plan.get('per_device_batch_size') or record.get('per_device_batch_size')
    if not batch:
        return ['cause: out of memory. Lower train_dataloader.batch_size (per device) and raise '
                'optim_wrapper.accumulative_counts to keep the global batch.']
    world = plan.get('world_size') or 1
    accum = plan.get('accumulative_counts') or 1
    global_batch = plan.get('global_batch_size') or batch * world * accum
    peak = memory.get('last') or memory.get('now') or {}
    fit, how = fitting_batch(batch, memory.get('baseline') or {}, peak,
                             requested_bytes(record.get('message', '')))
    per_device, k = best_split(global_batch, world, fit)  # global is world-divisible
    lines = [f'cause: out of memory at per-device batch {batch} ({batch} × {world} × '
             f'accumulation {accum} = global {global_batch})',
             f'fit: per-device batch {per_device} × {world} × accumulation {k} keeps the global '
             f'batch {global_batch} ({how})',
             f'fix: --cfg-options scaling.max_batch_per_device={per_device}   (DDPRunner), or '
             f'train_dataloader.batch_size={per_device} optim_wrapper.accumulative_counts={k}']
    lines.append('or: scaling.max_batch_per_device=auto measures the batch that fits on every '
                 'rank before training (on a CPU with scaling.memory_budget_mib), and '
                 'scaling.on_oom=microbatch redoes such a step as smaller micro-batches')
    if record.get('gradient_as_bucket_view') is False:
        lines.append('also: gradient_as_bucket_view is off: DDP keeps a second copy of the '
                     'gradients; model_wrapper_cfg.gradient_as_bucket_view=True saves it')
    for finding in record.get('stray_findings') or []:
        lines.append(f'stray: {finding}')
    return lines
