"""Exceptions for mistakes a user can fix: shown as one line, without a traceback."""


class UserError(Exception):
    """A mistake in the command line, environment or config; the message says what and the fix."""


class ConfigFileNotFound(UserError, FileNotFoundError):
    """The config argument names no file."""


class ScalingError(UserError, ValueError):
    """The ``scaling`` block, or the plan it leads to, is invalid for this run."""


class NothingFitsError(ScalingError):
    """The batch finder's warm-up or trials found no per-device batch that fits on every rank.

    Raised on every rank with the same list, so that the failure records and the diagnosis
    name the ranks that ran out, not the first rank to stop.

    Attributes:
        oom_ranks: The ranks that ran out of memory in the last trial.
    """

    def __init__(self, message: str, oom_ranks) -> None:
        super().__init__(message)
        self.oom_ranks = sorted(int(r) for r in oom_ranks)

    def __reduce__(self):  # picklable with its ranks (elastic's error files)
        return type(self), (str(self), self.oom_ranks)
