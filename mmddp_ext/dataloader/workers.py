"""DataLoader workers that die with their rank, and leave a stop signal to it.

torchrun signals the process group of each live rank only: the workers of a rank killed by
the host's OOM killer or a segfault live on as orphans, holding their memory. Each worker here
asks the kernel to SIGKILL it when its parent dies (``prctl(PR_SET_PDEATHSIG)``), then runs the
loader's own ``worker_init_fn``.

A stop signal sent to every process of the job (Slurm's preemption, ``scancel --signal``,
torchrun) would end the workers and then their rank before it saved. Each worker ignores the
stop signals (:data:`STOP_SIGNALS`): its rank decides, stops after the iteration the ranks agree
on, saves, and the workers end with it.
"""
import ctypes
import functools
import multiprocessing
import multiprocessing.util
import os
import signal
import sys
import threading
from typing import Any, Callable, List, Optional

from mmddp_launch.shared import STOP_SIGNALS

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


def kill_workers() -> None:
    """SIGKILL this process's live daemonic children (its DataLoader workers) and reap them.
    Run at exit (:func:`tie_workers` registers it): multiprocessing's own exit sends them
    SIGTERM and joins them, which a worker that ignores the stop signals would hold forever
    (a rank keeps its loader's iterator, and so its workers, alive to the end: persistent
    workers always, any loader's when the rank exits on an exception).

    torch's DataLoader sets a SIGCHLD handler in the main process that raises
    ``RuntimeError: DataLoader worker (pid …) is killed by signal: Killed`` for a worker that
    died of a signal; it is put back to the default first, so that a kill made on purpose at
    exit is not reported as a failure (the rank exits with its own code, its stderr clean).
    """
    children = [child for child in multiprocessing.active_children() if child.daemon]
    if not children:
        return
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for child in children:
        child.kill()
    for child in children:
        child.join()


_AT_EXIT_IN: List[int] = []  # the pid that registered it (a forked child inherits the list)


def _kill_workers_at_exit() -> None:
    """Register :func:`kill_workers` once per process, to run before multiprocessing stops and
    joins the daemonic children. A multiprocessing finalizer, not ``atexit``: a rank that is
    itself a multiprocessing child (``mmddp_ext.launch()``'s spawned workers, ``mp.spawn``)
    ends with ``os._exit`` after multiprocessing's exit function, and never runs ``atexit``
    handlers; a finalizer of priority >= 0 runs first in that function, which also runs at a
    main process's exit."""
    if _AT_EXIT_IN[-1:] != [os.getpid()]:
        _AT_EXIT_IN.append(os.getpid())
        multiprocessing.util.Finalize(None, kill_workers, exitpriority=100)


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
        for number in STOP_SIGNALS:  # the rank stops the job, and its workers with it
            signal.signal(number, signal.SIG_IGN)
        return super().__call__(*args, **kwargs)


def tie_workers(dataloader: Any) -> Any:
    """Make ``dataloader``'s worker processes die with this process and leave the stop
    signals to it (:data:`STOP_SIGNALS`); returns it.

    Only before its workers start (before the first ``iter()``); loaders without worker
    processes, or already tied, are returned unchanged.
    """
    if getattr(dataloader, 'num_workers',
               0) and not isinstance(getattr(dataloader, 'worker_init_fn', None), WorkerInit):
        dataloader.worker_init_fn = WorkerInit.around(dataloader.worker_init_fn)
        _kill_workers_at_exit()
    return dataloader
