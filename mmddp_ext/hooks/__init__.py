from ..agreement.hook import AgreementHook
from .finite_loss_hook import FiniteLossHook, NonFiniteLossError
from .memory_hook import RankMemoryHook
from .node_limits_hook import NodeLimitsHook
from .preemption_hook import STOPPED_EXIT_CODE, PreemptionHook, TrainingStopped
from .scaling_hook import ScalingHook
from .watchdog_hook import HangWatchdogHook

__all__ = [
    'AgreementHook', 'FiniteLossHook', 'HangWatchdogHook', 'NodeLimitsHook', 'NonFiniteLossError',
    'PreemptionHook', 'RankMemoryHook', 'STOPPED_EXIT_CODE', 'ScalingHook', 'TrainingStopped'
]
