"""Per-rank failure records: ``<work_dir>/failures/rank{R}.json`` (+ ``.traceback.txt``).

Written by the training entry when a rank raises, read by :mod:`mmddp_ext.diagnose`. The JSON
is written to a temporary file and renamed, so a reader never sees half a record.
"""
import glob
import json
import os
import os.path as osp
import socket
import time
import traceback
from typing import Any, Callable, Dict, List, Union

from .frames import exception_sites
from .memory.oom import address_space_limit, is_oom_error
from .utils.io import atomic_write_text

FAILURE_DIR = 'failures'


def failure_dir(work_dir: str) -> str:
    """Where the failure records of ``work_dir`` go."""
    return osp.join(work_dir, FAILURE_DIR)


def clear_failure(work_dir: str, rank: int) -> None:
    """Remove this rank's record of an earlier run, so a diagnosis never shows stale news."""
    for suffix in ('.json', '.traceback.txt'):
        try:
            os.remove(osp.join(failure_dir(work_dir), f'rank{rank}{suffix}'))
        except FileNotFoundError:
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
        out = failure_dir(work_dir)
        os.makedirs(out, exist_ok=True)
        tb_path = osp.join(out, f'rank{rank}.traceback.txt')
        with open(tb_path, 'w') as f:
            f.write(''.join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
        # classified here, where the error happened (the address-space limit is this
        # process's), by the same predicate the finder and on_oom='microbatch' use
        record = dict(rank=rank, host=socket.gethostname(), pid=os.getpid(), time=time.time(),
                      exc_type=type(exc).__name__, message=str(exc).strip(), oom=is_oom_error(exc),
                      address_space_limit=address_space_limit(),
                      traceback_file=osp.abspath(tb_path))
        if getattr(exc, 'oom_ranks', None) is not None:  # the ranks agreed: who ran out
            record['oom_ranks'] = list(exc.oom_ranks)
        record.update(exception_sites(exc))  # raised_at, user_at: file, line, source
        record.update(extra or {})
        if getattr(exc, 'ddp_param_names', None) is not None:  # set where the model was wrapped
            record['ddp_param_names'] = list(exc.ddp_param_names)
        path = osp.join(out, f'rank{rank}.json')
        atomic_write_text(path, json.dumps(record, indent=1, default=str))
        return path
    except Exception:  # a failure report must not hide the failure itself
        return ''


def read_failures(work_dir: str) -> List[Dict[str, Any]]:
    """All failure records of ``work_dir``, earliest first."""
    records = []
    for path in glob.glob(osp.join(failure_dir(work_dir), 'rank*.json')):
        try:
            with open(path) as f:
                records.append(json.load(f))
        except (OSError, ValueError):
            continue
    return sorted(records, key=lambda r: (r.get('time', 0), r.get('rank', 0)))
