"""Known-harmless warnings of MMEngine and MMPose, filtered narrowly, in one place.

Each filter matches one message by its exact text, its category (or log level) and the module
that emits it, and says why it is harmless; anything else from those modules still shows.
:class:`~mmddp_ext.runner.DDPRunner` installs them when it is built (:func:`quiet_warnings` in
``setup_env``, :func:`quiet_logger` on its logger); importing this module changes nothing.
``MMDDP_QUIET=0`` turns them off.
"""
import inspect
import logging
import os
import re
import warnings
from dataclasses import dataclass
from typing import Optional, Tuple

QUIET_ENV = 'MMDDP_QUIET'


@dataclass(frozen=True)
class KnownWarning:
    """A ``warnings.warn`` message known to be harmless.

    Attributes:
        message: Regular expression for the whole text (matched from its start, ignoring
            case, as Python's warning filters match; end it with ``$``).
        category: The warning class.
        module: The module that emits it (exact name).
        why: Why hiding it loses nothing.
    """

    message: str
    category: type
    module: str
    why: str


@dataclass(frozen=True)
class KnownLogWarning:
    """A warning MMEngine logs (``print_log``) that is known to be harmless where it comes from.

    Attributes:
        message: The exact text.
        emitter: The module whose code logs it (found on the call stack).
        contexts: ``(module, function)`` pairs; one of them must be on the call stack above
            the emitter, with ``file_client_args`` (its argument, or its ``self``'s) None.
        why: Why hiding it loses nothing.
    """

    message: str
    emitter: str
    contexts: Tuple[Tuple[str, str], ...]
    why: str


WARNINGS = (
    KnownWarning(
        message=re.escape(
            'Setting MKL_NUM_THREADS environment variable for each process to be 1 in default, '
            'to avoid your system being overloaded, please further tune the variable for '
            'optimal performance in your application as needed.') + '$', category=UserWarning,
        module='mmengine.utils.dl_utils.setup_env',
        why='MMEngine sets MKL_NUM_THREADS=1 when it is unset in a distributed run, after '
        'torch was imported: MKL in the training process already took its thread count '
        'from torch (mkl_get_max_threads is unchanged after the variable is set), so the '
        'variable only reaches processes started later, e.g. dataloader workers, where '
        'torch uses 1 thread anyway. Set MKL_NUM_THREADS yourself to choose.'),
    KnownWarning(
        message=(r'The metainfo config file "configs/_base_/datasets/(?P<name>[\w.-]+\.py)" '
                 r'does not exist\. A matched config file "[^"]*[/\\]mmpose[/\\]\.mim[/\\]'
                 r'configs[/\\]_base_[/\\]datasets[/\\](?P=name)" will be used instead\.$'),
        category=UserWarning, module='mmpose.datasets.datasets.utils',
        why='MMPose\'s own configs name their dataset metainfo by a path relative to the '
        'MMPose repository; used from an installed mmpose (``mmpose::`` configs) that path '
        'does not exist and MMPose loads the same file from its package. Only that case is '
        'hidden: the same file name under mmpose/.mim/configs/_base_/datasets/.'),
)

# Where MMEngine builds a FileClient it does not use when file_client_args is None.
_UNUSED_FILE_CLIENT = (('mmengine.hooks.checkpoint_hook', 'before_train'),
                       ('mmengine.runner.checkpoint', 'save_checkpoint'))

LOG_WARNINGS = (
    KnownLogWarning(
        message='"FileClient" will be deprecated in future. Please use io functions in '
        'https://mmengine.readthedocs.io/en/latest/api/fileio.html#file-io',
        emitter='mmengine.fileio.file_client', contexts=_UNUSED_FILE_CLIENT,
        why='MMEngine 0.10\'s CheckpointHook.before_train and its save_checkpoint function '
        'always build a FileClient "for backward compatibility" and, with '
        'file_client_args=None, never use it (they read and write through '
        'get_file_backend). Hidden only there, and only when file_client_args is None; a '
        'FileClient built anywhere else, or from file_client_args, still warns.'),
    KnownLogWarning(
        message='"HardDiskBackend" is the alias of "LocalBackend" and the former will be '
        'deprecated in future.', emitter='mmengine.fileio.file_client',
        contexts=_UNUSED_FILE_CLIENT,
        why='The backend of that same unused FileClient; same condition.'),
)


def enabled() -> bool:
    """Whether filtering is on (``MMDDP_QUIET`` unset or not ``0``)."""
    return os.environ.get(QUIET_ENV, '1') != '0'


def quiet_warnings() -> None:
    """Ignore the :data:`WARNINGS` (each by text, category and module). Idempotent: Python's
    ``filterwarnings`` replaces an identical filter. Does nothing with ``MMDDP_QUIET=0``."""
    if not enabled():
        return
    # albumentations 1.4 (MMPose's Albumentation transform) asks PyPI for a newer version at
    # import: up to 2 s per process and a warning on machines without internet; the version
    # is pinned by the install, so the answer is never acted on. A user's own setting wins.
    os.environ.setdefault('NO_ALBUMENTATIONS_UPDATE', '1')
    for known in WARNINGS:
        warnings.filterwarnings('ignore', message=known.message, category=known.category,
                                module=re.escape(known.module) + '$')


class KnownLogFilter(logging.Filter):
    """Drops the :data:`LOG_WARNINGS` records: WARNING level, exact text, emitted from their
    module called from one of their context functions with ``file_client_args=None``; every
    other record passes."""

    _texts = {known.message: known for known in LOG_WARNINGS}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING:
            return True
        known = self._texts.get(record.getMessage())
        return known is None or not _emitted_in(known)


def _emitted_in(known: KnownLogWarning) -> bool:
    """Whether the running call stack has ``known.emitter`` called from one of
    ``known.contexts`` with ``file_client_args`` (the function's, or its ``self``'s) None."""
    frame: Optional[object] = inspect.currentframe()
    seen_emitter = False
    depth = 0
    while frame is not None and depth < 40:
        name = frame.f_globals.get('__name__')
        if name == known.emitter:
            seen_emitter = True
        elif seen_emitter and (name, frame.f_code.co_name) in known.contexts:
            local = frame.f_locals
            if 'file_client_args' in local:
                return local['file_client_args'] is None
            return getattr(local.get('self'), 'file_client_args', 0) is None
        frame = frame.f_back
        depth += 1
    return False


def quiet_logger(logger: logging.Logger) -> logging.Logger:
    """``logger`` with a :class:`KnownLogFilter` (added once); returned for chaining. Does
    nothing with ``MMDDP_QUIET=0``."""
    if enabled() and not any(isinstance(f, KnownLogFilter) for f in logger.filters):
        logger.addFilter(KnownLogFilter())
    return logger
