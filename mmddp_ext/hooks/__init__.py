from .memory_hook import RankMemoryHook
from .scaling_hook import ScalingHook
from .watchdog_hook import HangWatchdogHook

__all__ = ['HangWatchdogHook', 'RankMemoryHook', 'ScalingHook']
