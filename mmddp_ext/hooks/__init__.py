from .agreement_hook import AgreementHook
from .finite_checkpoint_hook import FiniteCheckpointHook
from .finite_loss_hook import FiniteLossHook, NonFiniteLossError
from .global_loss_hook import GlobalLossHook
from .memory_hook import RankMemoryHook
from .node_limits_hook import NodeLimitsHook
from .preemption_hook import STOPPED_EXIT_CODE, PreemptionHook, TrainingStopped
from .scaling_hook import ScalingHook
from .watchdog_hook import HangWatchdogHook

__all__ = [
    'AgreementHook', 'FiniteCheckpointHook', 'FiniteLossHook', 'GlobalLossHook', 'HangWatchdogHook',
    'NodeLimitsHook', 'NonFiniteLossError', 'PreemptionHook', 'RankMemoryHook', 'STOPPED_EXIT_CODE',
    'ScalingHook', 'TrainingStopped'
]
