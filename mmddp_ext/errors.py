"""Exceptions for mistakes a user can fix: shown as one line, without a traceback."""


class UserError(Exception):
    """A mistake in the command line, environment or config; the message says what and the fix."""


class ConfigFileNotFound(UserError, FileNotFoundError):
    """The config argument names no file."""


class ScalingError(UserError, ValueError):
    """The ``scaling`` block, or the plan it leads to, is invalid for this run."""
