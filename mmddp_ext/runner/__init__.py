from .ddp_runner import DDPRunner
from .resumable_iter_loop import ResumableInfiniteSampler, ResumableIterLoop
from .resumable_loop import ResumableEpochLoop, ResumableSampler
from .runner_type import honour_runner_type

# Runner.from_cfg honours runner_type from the package's import: mmddp_ext.import_changes

__all__ = [
    'DDPRunner', 'ResumableEpochLoop', 'ResumableInfiniteSampler', 'ResumableIterLoop',
    'ResumableSampler', 'honour_runner_type'
]
