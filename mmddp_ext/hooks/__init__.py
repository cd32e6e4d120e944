from .finite_loss_hook import FiniteLossHook, NonFiniteLossError
from .memory_hook import RankMemoryHook
from .scaling_hook import ScalingHook
from .watchdog_hook import HangWatchdogHook

__all__ = [
    'FiniteLossHook', 'HangWatchdogHook', 'NonFiniteLossError', 'RankMemoryHook', 'ScalingHook'
]
