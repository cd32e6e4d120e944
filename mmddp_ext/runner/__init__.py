from .ddp_runner import DDPRunner
from .entry import honour_runner_type

honour_runner_type()  # Runner.from_cfg builds the config's runner_type (see .entry)

__all__ = ['DDPRunner', 'honour_runner_type']
