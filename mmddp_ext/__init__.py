"""mmddp_ext: correct, understandable multi-GPU and multi-node training for MMEngine projects.

Importing the package only registers things: ``DDPRunner`` and our hooks in MMEngine's
registries, the ``mmddp_ext::`` config scope in MMEngine's package table, and the safe local
checkpoint loader (see :mod:`mmddp_ext.checkpoint`).
"""
from . import hooks, runner  # noqa: F401  (registration)
from .checkpoint import register_safe_loader
from .dist import microbatch  # noqa: F401  (registration)
from .entry.launch import launch
from .utils.config import register_config_scope
from .version import __version__

register_config_scope()
register_safe_loader()

__all__ = ['__version__', 'launch']
