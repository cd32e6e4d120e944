"""``dist_train.py CONFIG --explain``: the launch topology and the scaling plan, no training.

Without ``--memory`` it touches neither data nor GPU; prints a readable summary, or with
``--json`` one JSON object
with at least the keys of :data:`JSON_KEYS`.

With ``--memory`` (:func:`forecast_memory`) it also runs a few real training steps of one
process on this machine's device (the batch finder's trial, :class:`mmddp_ext.runner.batch_finder.
Trials`), fits ``peak ≈ fixed + per_sample × batch`` (:mod:`mmddp_ext.memory.forecast`) and
adds, per rank, what DDP and the process bring; ``--json`` puts it under ``memory``.
"""
import copy
import json
import os
from typing import Any, Dict, List, Optional, Tuple

from .dist.env import DistEnv
from .dist.wrapper import ddp_wrapper_cfg
from .gpu import gpus, physical, rank_device
from .memory.budget import Budget
from .memory.forecast import (Cause, Forecast, ForecastError, build_forecast, fit_line, parse_size,
                              render_forecast, trial_batches)
from .memory.nvml import NvmlProcessTableReader
from .runner.batch_finder import reserve_bytes
from .runner.ddp_runner import plans
from .runner.trials import measure_steps
from .scaling.apply import CheckedScaling, apply_plan, plan_for_config, scaling_of
from .scaling.config import ScalingConfig
from .scaling.plan import ScalingPlan
from .scaling.report import plan_table
from .utils.units import MIB

JSON_KEYS = ('world_size', 'per_device_batch_size', 'accumulative_counts', 'global_batch_size',
             'base_batch_size', 'lr_rule', 'lr_scale', 'lrs', 'train_loop', 'max_epochs',
             'max_iters', 'iter_scale', 'warnings')


def _loop(cfg: Any) -> Dict[str, Any]:
    train_cfg = cfg.get('train_cfg') or {}
    loop = train_cfg.get('type')
    if loop is None:
        loop = 'EpochBasedTrainLoop' if train_cfg.get('by_epoch', True) else 'IterBasedTrainLoop'
    return dict(train_loop=loop, max_epochs=train_cfg.get('max_epochs'),
                max_iters=train_cfg.get('max_iters'))


def explain(cfg: Any, world_size: int, env: DistEnv,
            checked: Optional[CheckedScaling] = None) -> Dict[str, Any]:
    """The plan for ``world_size`` processes and the config it leads to, as a dict
    (``checked``: the block and plan the entry checked already, else planned here)."""
    plan: ScalingPlan = checked.plan if checked is not None else plan_for_config(cfg, world_size)
    applied = copy.deepcopy(cfg)
    changes = apply_plan(applied, plan)
    out = plan.to_dict()
    out.update(_loop(applied))
    if not plans(cfg.get('runner_type')):
        out['warnings'] = list(out['warnings']) + [
            f"runner_type is {repr(cfg['runner_type']) if 'runner_type' in cfg else 'not set'}"
            ": training keeps MMEngine's "
            "per-device batch and does not apply this plan; set runner_type='DDPRunner' (or "
            "inherit mmddp_ext::_base_/ddp_runtime.py) to use it"
        ]
    out['changes'] = changes
    out['describe'] = plan.describe()
    out['launch'] = dict(launcher=env.launcher, rank=env.rank, local_rank=env.local_rank,
                         node_rank=env.node_rank, nnodes=env.nnodes,
                         master=f'{env.master_addr}:{env.master_port}' if env.master_addr else None)
    return out


def render(info: Dict[str, Any], as_json: bool) -> str:
    """JSON (one object) or a readable summary."""
    if as_json:
        out = {k: v for k, v in info.items() if k != 'memory_forecast'}
        if info.get('memory_forecast') is not None:
            out['memory'] = info['memory_forecast'].to_dict()
        return json.dumps(out, default=str)
    launch = info['launch']
    before = [('launch', f'{info["world_size"]} process(es), launcher {launch["launcher"]}' +
               (f', master {launch["master"]}' if launch['master'] else ''))]
    after = [('loop', f'{info["train_loop"]}, max_epochs {info["max_epochs"]}, max_iters '
              f'{info["max_iters"]}')]
    lines = [
        plan_table(
            ScalingPlan.from_dict(info), info['changes'], before, after, warnings=info['warnings'])
    ]
    if info.get('memory_forecast') is not None:
        lines += render_forecast(info['memory_forecast'])
    return '\n'.join(lines)


def _device_memory(text: Optional[str], device: Any, ranks_per_node: int) -> Tuple[float, str]:
    """MiB per device to plan for, and where the number comes from."""
    if text is not None:
        return parse_size(text), f'--device-memory {text}'
    if device.type == 'cuda':
        g = gpus()
        total = g.mem_get_info(device.index)[1] / MIB
        return total, f'total memory of {device} ({g.name(device.index)})'
    import psutil
    total = psutil.virtual_memory().total / MIB
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
    wrapper = ddp_wrapper_cfg(cfg, cuda, 0, policy)
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
