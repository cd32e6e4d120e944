from .memory_hook import RankMemoryHook
from .scaling_hook import ScalingHook

__all__ = ['RankMemoryHook', 'ScalingHook']
