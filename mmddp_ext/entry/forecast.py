"""``--explain --memory``: a few real training steps of one process on this machine's device
(the batch finder's trials), the fit ``peak ≈ fixed + per_sample × batch``
(:mod:`mmddp_ext.memory.forecast`) and, per rank, what DDP and the process bring
(``docs/memory.md``)."""
import os
from typing import Any, List, Optional, Tuple

from ..batch_finder.trials import measure_steps, reserve_bytes
from ..ddp.wrapper import ddp_wrapper_cfg
from ..gpu import gpus, physical, rank_device
from ..memory.budget import Budget
from ..memory.forecast import (Cause, Forecast, ForecastError, build_forecast, fit_line, parse_size,
                               trial_batches)
from ..memory.nvml import NvmlProcessTableReader
from ..scaling.apply import CheckedScaling, scaling_of
from ..scaling.config import ScalingConfig
from ..utils.memory_reads import host_memory_bytes
from ..utils.units import MIB


def _device_memory(text: Optional[str], device: Any, ranks_per_node: int) -> Tuple[float, str]:
    """MiB per device to plan for, and where the number comes from."""
    if text is not None:
        return parse_size(text), f'--device-memory {text}'
    if device.type == 'cuda':
        g = gpus()
        total = g.mem_get_info(device.index)[1] / MIB
        return total, f'total memory of {device} ({g.name(device.index)})'
    total = host_memory_bytes() / MIB
    return total / ranks_per_node, (f'CPU: {total:.0f} MiB of RAM shared by {ranks_per_node} '
                                    f'rank(s) on this node')


def _stray(device: Any, ranks_per_node: int) -> Cause:
    """Device memory held now by other processes on the GPU of each local rank."""
    if device.type != 'cuda':
        return Cause('stray_contexts', 0.0, False, 'no GPU: no CUDA contexts to stray')
    if not NvmlProcessTableReader.available():
        return Cause('stray_contexts', 0.0, True, 'not measured: NVML is not available')
    count = min(ranks_per_node, gpus().count())
    per_rank, seen_self = [], False
    gpus().empty_cache()
    with NvmlProcessTableReader() as reader:
        for local in range(count):
            table = reader.read(physical(local))
            seen_self |= any(p.pid == os.getpid() for p in table.processes)
            per_rank.append(
                sum(p.used_bytes or 0 for p in table.processes if p.pid != os.getpid()) / MIB)
    per_rank += [0.0] * (ranks_per_node - count)
    how = 'NVML now: memory of other processes on each local rank\'s GPU'
    if not seen_self:  # NVML shows the host's pids (a container): ours is not recognised
        how += ('; this process was not found in NVML\'s tables (pid namespace), so its own '
                'context may be counted as stray')
    return Cause('stray_contexts', max(per_rank), not seen_self, how, per_rank=tuple(per_rank))


def _ddp_causes(cfg: Any, cuda: bool, grad_mib: float,
                scaling: Optional[ScalingConfig] = None) -> List[Cause]:
    """What the DDP wrapper the run would build adds per rank."""
    policy = (scaling or scaling_of(cfg)).oom_policy
    wrapper = ddp_wrapper_cfg(cfg, cuda, policy)
    kind = wrapper.get('type', 'MMDistributedDataParallel')
    bucket_mib = min(float(wrapper.get('bucket_cap_mb', 25)), grad_mib)
    if kind == 'MicrobatchDDP':
        copy_ = Cause('gradient_bucket_copy', 0.0, False, 'MicrobatchDDP has no buckets: the '
                      'gradients are views of one flat buffer')
    elif wrapper.get('gradient_as_bucket_view'):
        copy_ = Cause('gradient_bucket_copy', 0.0, False, 'gradient_as_bucket_view=True: the '
                      'gradients are views of the buckets')
    else:
        copy_ = Cause(
            'gradient_bucket_copy', grad_mib, False, f'{kind} without '
            'gradient_as_bucket_view keeps the buckets beside the gradients: one '
            'more copy of the trainable parameters\' gradients')
    comm = Cause(
        'communication_buffers', bucket_mib, True, f'one all-reduce buffer of a '
        f'bucket in flight (bucket_cap_mb {wrapper.get("bucket_cap_mb", 25)}, at '
        f'most the gradients\' {grad_mib:.0f} MiB)')
    return [copy_, comm]


def forecast_memory(cfg: Any, world_size: int, batch: int, nnodes: int = 1,
                    device_memory: Optional[str] = None,
                    checked: Optional[CheckedScaling] = None) -> Forecast:
    """Measure one process and forecast every rank of ``world_size`` at per-device ``batch``
    (see :mod:`mmddp_ext.memory.forecast`). Runs a few real training steps on this machine's
    device (the current GPU, else the CPU). ``checked``: the parsed ``scaling`` block, when
    the entry has it.

    Raises:
        ForecastError: a bad ``device_memory``, or a device below the fixed memory.
    """
    ranks_per_node = -(-world_size // max(1, nnodes))
    device = rank_device()
    cuda = device.type == 'cuda'
    device_mib, device_how = _device_memory(device_memory, device, ranks_per_node)  # early
    measured = measure_steps(cfg, trial_batches(batch), device)
    if len(measured.steps) < 2:
        raise ForecastError(f'only {len(measured.steps)} of the trial batches '
                            f'{trial_batches(batch)} fitted on {device}: free memory on it '
                            f'or plan a smaller per-device batch')
    fit = fit_line([(s.batch, s.peak_bytes / MIB) for s in measured.steps])
    kind = 'CUDA context and library workspaces' if cuda else 'interpreter and libraries'
    causes = [
        Cause('process_context', measured.context_bytes / MIB, False,
              f'{kind}: {measured.context_how}', single=True)
    ]
    causes += _ddp_causes(cfg, cuda, measured.grad_bytes / MIB,
                          checked.scaling if checked is not None else None)
    causes.append(_stray(device, ranks_per_node))
    reserve = reserve_bytes(Budget(str(device), int(device_mib * MIB), device_how)) / MIB
    return build_forecast(fit, causes, device_mib, device_how, reserve, world_size, batch,
                          measured.method, measured.seconds)
