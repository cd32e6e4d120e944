"""The advice under an out-of-memory failure in the diagnosis: the per-device batch that fits
(:func:`fitting_batch`, from the failed allocation's size, :func:`requested_bytes`) split so
that the global batch stays, or why no batch fits. docs/memory.md shows it.
"""
import re
from typing import Any, List, Mapping, Optional, Tuple

from ..memory.budget import MARGIN
from ..scaling.split import best_split
from ..utils.batch import batch_text
from ..utils.units import BYTES_PER_UNIT, GIB, MIB, format_mib
from .classify import MAP_SEGMENT


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


def _batch_lines(record: Mapping[str, Any]) -> List[str]:
    """The batch that ran out (what made it heavy) beside the samples the finder measured."""
    lines = []
    heavy = batch_text(record.get('oom_batch'))
    if heavy:
        lines.append(f'batch: {heavy}')
    measured = (record.get('finder') or {}).get('samples')
    if measured:
        lines.append(f'the finder measured: {measured}')
    return lines


def oom_advice(record: Mapping[str, Any]) -> List[str]:
    """Lines of advice for an OOM failure record (see :mod:`mmddp_ext.diagnose.records`).

    The advice follows what was measured: ``oom_at_batch`` (the smallest per-device batch or
    micro-batch that ran out of memory, from ``on_oom='microbatch'``) is used instead of the
    planned batch when present, and a record that shows that nothing fits says so instead of
    suggesting a batch.
    """
    stuck = _nothing_fits(record)
    if stuck is not None:
        return stuck[:1] + _batch_lines(record) + stuck[1:]
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
        f'accumulation {accum} = global {global_batch})', *_batch_lines(record),
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
