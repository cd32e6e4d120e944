"""mmddp_ext: correct, understandable multi-GPU and multi-node training for MMEngine projects.

Importing the package registers ``DDPRunner``, our hooks, loops and samplers in MMEngine's
registries, and makes the few changes :mod:`mmddp_ext.import_changes` lists with their reasons
(the ``mmddp_ext::`` config scope, the safe local checkpoint loader, ``runner_type`` honoured by
``Runner.from_cfg``).
"""
from . import hooks, runner  # noqa: F401  (registration)
from .ddp import microbatch  # noqa: F401  (registration)
from .entry.launch import LaunchFailed, launch
from .import_changes import apply_import_changes
from .version import __version__

apply_import_changes()

__all__ = ['__version__', 'LaunchFailed', 'launch']
