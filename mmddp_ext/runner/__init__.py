from .ddp_runner import DDPRunner
from .resumable_iter_loop import ResumableInfiniteSampler, ResumableIterLoop
from .resumable_loop import ResumableEpochLoop, ResumableSampler
from .runner_type import honour_runner_type

honour_runner_type()  # Runner.from_cfg builds the config's runner_type (see .entry)

__all__ = [
    'DDPRunner', 'ResumableEpochLoop', 'ResumableInfiniteSampler', 'ResumableIterLoop',
    'ResumableSampler', 'honour_runner_type'
]
