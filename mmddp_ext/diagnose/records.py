"""Per-rank records under a run's work dir, written atomically and read tolerantly: what a
failed or stuck run leaves for the diagnosis (``docs/failures.md``).

* ``failures/rank{R}.json`` (+ ``.traceback.txt``): written by the training entry when a rank
  raises (:func:`record_failure`);
* ``ranks/rank{R}.json``: progress, rewritten by :class:`~mmddp_ext.hooks.HangWatchdogHook`
  after every iteration (:class:`ProgressFile`); ``ranks/rank{R}.stacks.txt``: the
  :mod:`faulthandler` dump of a stuck or stopped rank; ``ranks/rank{R}.stderr.txt``: the copy
  of its stderr (:mod:`~mmddp_ext.diagnose.stderr_copy`); ``ranks/launch.json``: the
  launcher's report, kept by the diagnosis.

A work dir that refuses them (full, read-only, permission refused, gone) does not silence
them: they go to the spare folder of :mod:`~mmddp_ext.diagnose.spare_records`, and every
reader here reads it beside the work dir.
"""
import contextlib
import glob
import json
import os
import os.path as osp
import socket
import time
import traceback
import weakref
from typing import Any, Callable, Dict, List, Optional, Union

from mmddp_launch.files import atomic_write_text

from ..oom.classify import address_space_limit, is_oom_error
from .frames import exception_sites
from .spare_records import refusal, spare_dir
from .stderr_copy import stderr_tail

FAILURE_DIR = 'failures'


def failure_dir(work_dir: str) -> str:
    """Where the failure records of ``work_dir`` go."""
    return osp.join(work_dir, FAILURE_DIR)


def clear_failure(work_dir: str, rank: int) -> None:
    """Remove this rank's record of an earlier run (also a spare one), so a diagnosis never
    shows stale news."""
    for folder in (work_dir, spare_dir(work_dir)):
        for suffix in ('.json', '.traceback.txt'):
            try:
                os.remove(osp.join(failure_dir(folder), f'rank{rank}{suffix}'))
            except OSError:  # none, or a work dir that refuses: nothing to clear
                pass


def record_failure(work_dir: str, rank: int, exc: BaseException,
                   extra: Union[None, Dict[str, Any], Callable[[], Dict[str, Any]]] = None) -> str:
    """Write this rank's failure record; returns the JSON path. Never raises.

    ``extra`` (a dict, or a function returning one, called here so that its own errors are
    contained) is merged into the record: memory snapshot, scaling plan, ...
    """
    if callable(extra):
        try:
            extra = extra()
        except Exception as e:  # the record must not hide the failure itself
            extra = {'context_error': repr(e)}
    try:
        record = dict(rank=rank, host=socket.gethostname(), pid=os.getpid(), time=time.time(),
                      exc_type=type(exc).__name__, message=str(exc).strip(), oom=is_oom_error(exc),
                      address_space_limit=address_space_limit())
        # classified here, where the error happened (the address-space limit is this
        # process's), by the same predicate the finder and on_oom='microbatch' use
        if getattr(exc, 'oom_ranks', None) is not None:  # the ranks agreed: who ran out
            record['oom_ranks'] = list(exc.oom_ranks)
            record['oom'] = True  # also the finder's NothingFitsError, raised after the trials
        record.update(exception_sites(exc))  # raised_at, user_at: file, line, source
        record.update(extra or {})
        if getattr(exc, 'ddp_param_names', None) is not None:  # set where the model was wrapped
            record['ddp_param_names'] = list(exc.ddp_param_names)
        text = ''.join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except Exception:  # a failure report must not hide the failure itself
        return ''
    try:
        return _write_failure(work_dir, rank, record, text)
    except OSError as e:  # the work dir refuses: keep the record where the diagnosis looks next
        record['work_dir_error'] = refusal(work_dir, e)
    try:
        return _write_failure(spare_dir(work_dir), rank, record, text)
    except Exception:
        return ''


def _write_failure(folder: str, rank: int, record: Dict[str, Any], text: str) -> str:
    out = failure_dir(folder)
    os.makedirs(out, exist_ok=True)
    tb_path = osp.join(out, f'rank{rank}.traceback.txt')
    atomic_write_text(tb_path, text, durable=False)
    record = dict(record, traceback_file=osp.abspath(tb_path))
    path = osp.join(out, f'rank{rank}.json')
    atomic_write_text(path, json.dumps(record, indent=1, default=str))
    return path


def _read_rank_files(folder: str) -> List[Any]:
    """The ``rank*.json`` files of ``folder``, parsed; one that cannot be read or parsed (a
    rank died while the folder was read, a file of another tool) is passed over."""
    out = []
    for path in glob.glob(osp.join(folder, 'rank*.json')):
        for attempt in range(3):  # a progress file met in the middle of its rewrite: again
            try:
                with open(path) as f:
                    out.append(json.load(f))
                break
            except ValueError:
                continue
            except OSError:
                break
    return out


def read_failures(work_dir: str) -> List[Dict[str, Any]]:
    """All failure records of ``work_dir`` and of its spare folder (a rank's newest one),
    earliest first."""
    newest: Dict[Any, Dict[str, Any]] = {}
    for record in (_read_rank_files(failure_dir(work_dir)) +
                   _read_rank_files(failure_dir(spare_dir(work_dir)))):
        rank = record.get('rank')
        if rank not in newest or record.get('time', 0) > newest[rank].get('time', 0):
            newest[rank] = record
    return sorted(newest.values(), key=lambda r: (r.get('time', 0), r.get('rank', 0)))


WORK_DIR_NOTE_ENV = 'MMDDP_WORK_DIR_NOTE'  # set by mmddp_ext.launch() for its workers


def note_work_dir(work_dir: str) -> None:
    """Tell the launcher that started this rank (:func:`mmddp_ext.launch`, through
    ``$MMDDP_WORK_DIR_NOTE``) where its records are, so that a failure it reports can name the
    rank at fault; nothing when no launcher asked. Never raises."""
    path = os.environ.get(WORK_DIR_NOTE_ENV)
    if path:
        try:
            atomic_write_text(path, osp.abspath(work_dir), durable=False)
        except OSError:
            pass


def noted_work_dir(path: str) -> Union[str, None]:
    """The work_dir a rank noted in ``path`` (:func:`note_work_dir`), or None."""
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None


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
    """This rank's copy of its stderr (:mod:`mmddp_ext.diagnose.stderr_copy`)."""
    return osp.join(ranks_dir(work_dir), f'rank{rank}.stderr.txt')


def launch_report_path(work_dir: str) -> str:
    """Where the diagnosis keeps the launcher's failure report of the last failed run."""
    return osp.join(ranks_dir(work_dir), LAUNCH_REPORT)


def begin_progress(work_dir: str, rank: int) -> str:
    """A new run's progress records begin: ``ranks/`` exists and, on rank 0, an earlier run's
    launcher report is gone (it is not news about this run); so is this rank's spare progress
    file of an earlier run. Returns this rank's progress file."""
    try:
        os.remove(progress_path(spare_dir(work_dir), rank))
    except OSError:
        pass
    os.makedirs(ranks_dir(work_dir), exist_ok=True)
    if rank == 0:
        try:
            os.remove(launch_report_path(work_dir))
        except FileNotFoundError:
            pass
    return progress_path(work_dir, rank)


class ProgressFile:
    """A rank's progress file, rewritten after every iteration at the cost of one ``pwrite``.

    Opened once; each :meth:`write` puts the whole JSON text at offset 0 in one system call
    (a few hundred bytes: one page, written whole or not at all, also by a process killed at
    that moment), padded with spaces to the longest text written so far, so no tail of an
    earlier, longer text is left (JSON ignores the spaces). Without fsync: a dead process does
    not lose what it wrote. A reader that meets a write in progress reads again
    (:func:`_read_rank_files`). An open, write, rename and close every iteration cost about
    five times more than this.

    Args:
        path: the progress file in the work dir.
        work_dir: where a refused write goes instead: the rank's progress file in the spare
            folder (:mod:`~mmddp_ext.diagnose.spare_records`), with ``work_dir_error``. A write
            the spare folder refuses too is dropped: progress never stops the training.
    """

    def __init__(self, path: str, work_dir: Optional[str] = None) -> None:
        self.path = path
        self._work_dir = work_dir
        self._refused: Optional[Dict[str, str]] = None
        self._open(path)

    def _open(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._size = 0
        self.close = weakref.finalize(self, os.close, self._fd)  # also when a run raises

    def write(self, state: Dict[str, Any]) -> None:
        try:
            self._write(state)
        except OSError as e:
            if self._work_dir is None:
                raise
            if self._refused is None:  # the first refusal: on to the spare folder, once
                self._refused = refusal(self._work_dir, e)
                with contextlib.suppress(OSError):
                    self.close()
                    os.makedirs(ranks_dir(spare_dir(self._work_dir)), exist_ok=True)
                    self.path = progress_path(spare_dir(self._work_dir), state.get('rank'))
                    self._open(self.path)
                    self._write(state)

    def _write(self, state: Dict[str, Any]) -> None:
        if self._refused:
            state = dict(state, work_dir_error=self._refused)
        text = json.dumps(state).encode()
        os.pwrite(self._fd, text.ljust(max(self._size, len(text))), 0)
        self._size = max(self._size, len(text))


def read_ranks(work_dir: str) -> Dict[int, Dict[str, Any]]:
    """Every rank's last progress state, with its stack dump text (``stacks``) when present;
    a progress file in the spare folder (the work dir refused the rank's writes) comes
    before the one in the work dir.

    Returns:
        ``{rank: state}``; empty when no rank wrote progress (no watchdog, or the run ended
        before training started).
    """
    out: Dict[int, Dict[str, Any]] = {}
    spare = _read_rank_files(ranks_dir(spare_dir(work_dir)))
    for state in _read_rank_files(ranks_dir(work_dir)) + spare:
        try:
            rank = int(state['rank'])
        except (ValueError, KeyError, TypeError):
            continue
        try:
            with open(stacks_path(work_dir, rank), errors='replace') as f:
                state['stacks'] = f.read()
        except OSError:
            state['stacks'] = ''
        state['stderr_tail'] = stderr_tail(stderr_path(work_dir, rank))
        out[rank] = state
    return out


def read_launch_report(work_dir: str) -> List[Dict]:
    """The launcher's report kept in ``work_dir`` (:func:`keep_launch_report`), [] where none."""
    try:
        with open(launch_report_path(work_dir)) as f:
            data = json.load(f)
        return data if isinstance(data, list) else []
    except (OSError, ValueError):
        return []


def keep_launch_report(work_dir: str, path: str) -> List[Dict]:
    """Read the launcher's report and keep a copy in ``work_dir`` for later diagnoses."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return []
    if not isinstance(data, list):
        return []
    if osp.isdir(work_dir):
        try:
            os.makedirs(ranks_dir(work_dir), exist_ok=True)
            atomic_write_text(launch_report_path(work_dir), json.dumps(data))
        except OSError:
            pass
    return data
