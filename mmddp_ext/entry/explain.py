"""``dist_train.py CONFIG --explain``: the launch topology and the scaling plan, no training,
as a readable summary or one JSON object (``docs/scaling.md``), with what one node's ranks need
of it (:mod:`mmddp_ext.entry.node_report`); with ``--memory`` the forecast of
:mod:`mmddp_ext.entry.forecast` beside it."""
import copy
import json
from typing import Any, Dict, Optional

from ..gpu import gpus
from ..launcher.env import DistEnv
from ..memory.forecast import render_forecast
from ..runner.ddp_runner import applies_plan
from ..scaling.apply import CheckedScaling, apply_plan, plan_for_config
from ..scaling.plan import ScalingPlan
from ..scaling.report import plan_table
from ..utils.mmcv_ops import missing_gpu_ops
from .node_report import node_report, render_node

JSON_KEYS = ('world_size', 'per_device_batch_size', 'accumulative_counts', 'global_batch_size',
             'base_batch_size', 'lr_rule', 'lr_scale', 'lrs', 'train_loop', 'max_epochs',
             'max_iters', 'iter_scale', 'warnings', 'node')


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
    if not applies_plan(cfg.get('runner_type')):
        out['warnings'] = list(out['warnings']) + [
            f"runner_type is {repr(cfg['runner_type']) if 'runner_type' in cfg else 'not set'}"
            ": training keeps MMEngine's "
            "per-device batch and does not apply this plan; set runner_type='DDPRunner' (or "
            "inherit mmddp_ext::_base_/ddp_runtime.py) to use it"
        ]
    ops = missing_gpu_ops(cfg, gpus().available())
    if ops is not None:
        out['warnings'] = list(out['warnings']) + [ops]
    out['changes'] = changes
    out['describe'] = plan.describe()
    out['launch'] = dict(launcher=env.launcher, rank=env.rank, local_rank=env.local_rank,
                         node_rank=env.node_rank, nnodes=env.nnodes,
                         master=f'{env.master_addr}:{env.master_port}' if env.master_addr else None)
    out['node'] = node_report(applied, plan.world_size, env.nnodes, plan.per_device_batch_size)
    out['warnings'] = list(out['warnings']) + [
        f'{f["name"]} on each node does not fit ({f["how"]}): {f["fix"]}'
        for f in out['node']['figures'] if f['fits'] is False
    ]
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
    if info.get('node') is not None:
        lines += render_node(info['node'])
    if info.get('memory_forecast') is not None:
        lines += render_forecast(info['memory_forecast'])
    return '\n'.join(lines)
