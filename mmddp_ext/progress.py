"""Per-rank progress files: ``<work_dir>/ranks/rank{R}.json`` and ``rank{R}.stacks.txt``.

Written by :class:`~mmddp_ext.hooks.HangWatchdogHook` on every rank, read by
:mod:`mmddp_ext.diagnose`. They answer what a failure record cannot, because a rank that hangs
or is killed by a signal never raises:

* ``rank{R}.json``: pid, host, the main thread's id, the phase (``train``/``val``/...), the
  last training iteration the rank completed, the slowest recent iteration time, the host
  RSS and device memory at that moment, the watchdog's bound; rewritten after every
  iteration (a few hundred bytes, no fsync: a dead process does not lose written pages).
* ``rank{R}.stacks.txt``: Python's :mod:`faulthandler` dump of every thread, written by the
  interpreter itself when the watchdog's bound passes (``Timeout (h:mm:ss)!`` heading) or when
  the launcher sends SIGTERM to stop the rank. Works while the main thread is blocked in C++
  (a collective, a CUDA call), without any set-up by the user.
* ``rank{R}.stderr.txt``: a copy of the rank's stderr, C++ included (written by the entry,
  :mod:`mmddp_ext.stderr_copy`): what a rank that aborted in native code said last.
"""
import json
import os
import os.path as osp
from typing import Any, Dict

from .stderr_copy import stderr_tail
from .utils.io import atomic_write_text

RANKS_DIR = 'ranks'
LAUNCH_REPORT = 'launch.json'  # the launcher's failure report, kept by the diagnosis


def ranks_dir(work_dir: str) -> str:
    """Where the per-rank progress files of ``work_dir`` go."""
    return osp.join(work_dir, RANKS_DIR)


def progress_path(work_dir: str, rank: int) -> str:
    """This rank's progress file."""
    return osp.join(ranks_dir(work_dir), f'rank{rank}.json')


def stacks_path(work_dir: str, rank: int) -> str:
    """This rank's stack dump (written by :mod:`faulthandler`)."""
    return osp.join(ranks_dir(work_dir), f'rank{rank}.stacks.txt')


def stderr_path(work_dir: str, rank: int) -> str:
    """This rank's copy of its stderr (:mod:`mmddp_ext.stderr_copy`)."""
    return osp.join(ranks_dir(work_dir), f'rank{rank}.stderr.txt')


def launch_report_path(work_dir: str) -> str:
    """Where the diagnosis keeps the launcher's failure report of the last failed run."""
    return osp.join(ranks_dir(work_dir), LAUNCH_REPORT)


def write_progress(path: str, state: Dict[str, Any]) -> None:
    """Replace the progress file with ``state`` atomically (never half a file); without fsync:
    it is rewritten every iteration, and a dead process does not lose what it wrote."""
    atomic_write_text(path, json.dumps(state), durable=False)


def read_ranks(work_dir: str) -> Dict[int, Dict[str, Any]]:
    """Every rank's last progress state, with its stack dump text (``stacks``) when present.

    Returns:
        ``{rank: state}``; empty when no rank wrote progress (no watchdog, or the run ended
        before training started).
    """
    out: Dict[int, Dict[str, Any]] = {}
    folder = ranks_dir(work_dir)
    try:
        names = os.listdir(folder)
    except OSError:
        return out
    for name in names:
        if not (name.startswith('rank') and name.endswith('.json')):
            continue
        try:
            with open(osp.join(folder, name)) as f:
                state = json.load(f)
            rank = int(state['rank'])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        try:
            with open(stacks_path(work_dir, rank), errors='replace') as f:
                state['stacks'] = f.read()
        except OSError:
            state['stacks'] = ''
        state['stderr_tail'] = stderr_tail(stderr_path(work_dir, rank))
        out[rank] = state
    return out
