"""Plan per-device batch, gradient accumulation, LR scale and iteration rescaling.

Pure standard library: importing this subpackage needs neither torch nor mmengine.
"""
from .config import SCALING_KEYS, ScalingConfig, parse_scaling
from .plan import ConfigFacts, ScalingPlan, make_plan, name_batch, scale_iters

__all__ = [
    'SCALING_KEYS', 'ScalingConfig', 'parse_scaling', 'ConfigFacts', 'ScalingPlan', 'make_plan',
    'name_batch', 'scale_iters'
]
