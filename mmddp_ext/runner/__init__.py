from .ddp_runner import DDPRunner
from .resumable_loop import ResumableEpochLoop, ResumableSampler
from .runner_type import honour_runner_type

honour_runner_type()  # Runner.from_cfg builds the config's runner_type (see .entry)

__all__ = ['DDPRunner', 'ResumableEpochLoop', 'ResumableSampler', 'honour_runner_type']
