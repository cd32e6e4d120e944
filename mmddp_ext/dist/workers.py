"""DataLoader workers that die with their rank.

torchrun stops a job by signalling each live rank's process group, but a rank that is already
dead (SIGKILL from the host's OOM killer, a segfault) is skipped, and its DataLoader workers
live on as orphans: measured 29 minutes and more at about 560 MiB each, until killed by hand,
and one more set per elastic restart. Each worker here asks the kernel to SIGKILL it when its
parent dies (Linux ``prctl(PR_SET_PDEATHSIG)``), then runs the loader's own ``worker_init_fn``.

Nothing else of the rank's signal handling is touched: torch's worker set-up replaces the
SIGTERM handler a forked worker inherits (the rank's ``PreemptionHook`` handler and
``HangWatchdogHook``'s stack dump) by its own, which ends the worker, before this init runs.
"""
import ctypes
import functools
import os
import signal
import sys
from typing import Any, Callable, Optional

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> bool:
    """Ask the kernel to SIGKILL this process when its parent exits (Linux; else no-op).

    Returns:
        Whether the request was made. If the parent is already gone (it died before the
        request), the process exits at once.
    """
    if not sys.platform.startswith('linux'):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)
    return True


def _no_init(worker_id: int) -> None:
    """The worker init of a loader that had none."""


class WorkerInit(functools.partial):
    """A DataLoader ``worker_init_fn`` that ties the worker's life to its rank, then calls
    the loader's own one.

    It is a :class:`functools.partial` of that function, as MMEngine's ``build_dataloader``
    makes it: ``.func``, ``.args`` and ``.keywords`` are the loader's own (code that reads
    ``dataloader.worker_init_fn.func`` still finds MMEngine's seeding or the config's
    function), and it pickles with every multiprocessing start method.
    """

    parent_pid: int

    @classmethod
    def around(cls, fn: Optional[Callable[..., Any]]) -> 'WorkerInit':
        """The tied version of ``fn`` (a partial is unwrapped into this one; None: no init)."""
        if isinstance(fn, functools.partial):
            tied = cls(fn.func, *fn.args, **fn.keywords)
        else:
            tied = cls(fn if fn is not None else _no_init)
        tied.parent_pid = os.getpid()
        return tied

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        die_with_parent(self.parent_pid)
        return super().__call__(*args, **kwargs)


def tie_workers(dataloader: Any) -> Any:
    """Make ``dataloader``'s worker processes die with this process; returns it.

    Only before its workers start (before the first ``iter()``); loaders without worker
    processes, or already tied, are returned unchanged.
    """
    if getattr(dataloader, 'num_workers',
               0) and not isinstance(getattr(dataloader, 'worker_init_fn', None), WorkerInit):
        dataloader.worker_init_fn = WorkerInit.around(dataloader.worker_init_fn)
    return dataloader
