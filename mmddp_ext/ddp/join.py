"""What a rank sets up before its Runner is built, in one call for every runner: the model
wrapper config (:func:`~.wrapper.model_wrapper_for`) and the process group
(:func:`~.process_group.ensure_process_group`).

Called once per run, before the model is built: by :class:`~mmddp_ext.runner.DDPRunner`'s
``from_cfg`` (from ``tools/dist_train.py``, MMPose's or MMDetection's ``tools/train.py``, a
script), or by the training entry for a stock Runner, which has no ``from_cfg`` of ours.
"""
from typing import Any, List, Optional

from ..launcher.env import DistEnv
from ..scaling.config import ScalingConfig
from .process_group import ensure_process_group
from .wrapper import model_wrapper_for


def join_job(cfg: Any, scaling: Optional[ScalingConfig] = None,
             env: Optional[DistEnv] = None) -> List[str]:
    """Set ``cfg.model_wrapper_cfg`` for this run and start the process group when the run is
    distributed (``cfg.launcher`` other than ``'none'``).

    Args:
        cfg: The config to build the runner from; its ``model_wrapper_cfg`` is replaced where
            the run needs another wrapper.
        scaling: The checked ``scaling`` block of a planning runner: its ``on_oom`` policy
            picks the wrapper. None for a stock Runner (MMEngine's DDP, lean defaults).
        env: The launcher's environment, when the caller read it already.

    Returns:
        Lines for the log (the backend, a warning about it), empty when no group was started.
    """
    launcher = cfg.get('launcher', 'none')
    on_oom, by_default = 'raise', False  # a stock Runner: MMEngine's DDP, lean defaults
    if scaling is not None:
        on_oom, by_default = scaling.oom_policy, scaling.on_oom is None
    wrapper = model_wrapper_for(cfg, launcher != 'none', on_oom, guard_by_default=by_default)
    if wrapper is not None:
        cfg.model_wrapper_cfg = wrapper
    return ensure_process_group(launcher, (cfg.get('env_cfg') or {}).get('dist_cfg'), env)
