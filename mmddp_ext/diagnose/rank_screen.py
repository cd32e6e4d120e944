"""The screen a failed rank prints itself, after its traceback, where no front of ours prints the
job's diagnosis (torchrun itself, srun, mpirun, ranks started by hand): its own cause and fix,
or the peer it lost and what that peer left, and the command that gives the whole job's view.

Under ``dist_train.sh`` and ``mmddp_ext.launch()`` the front prints the job's diagnosis once,
and the ranks print nothing more (:func:`front_prints_diagnosis`).
"""
import os
import os.path as osp
import socket
import sys
import time
from typing import Callable, Dict, List, Mapping, Optional

import psutil

from ..launcher.torchrun_front import REPORT_ENV
from .frames import frame_text
from .records import WORK_DIR_NOTE_ENV, read_failures, read_ranks
from .spare_records import refused_lines
from .stacks import Frame, wait_site
from .summary import agreed_only, first_lines, raised_lines, shown_message, waited

PEER_WAIT = 10.0  # seconds a rank that lost its peer waits for the peer's record to appear


def front_prints_diagnosis(environ: Mapping[str, str]) -> bool:
    """Whether a front of ours started this rank and prints the job's diagnosis after it:
    ``dist_train.sh`` (its torchrun front, ``$MMDDP_LAUNCH_REPORT``) or ``mmddp_ext.launch()``
    (``$MMDDP_WORK_DIR_NOTE``)."""
    return bool(environ.get(REPORT_ENV) or environ.get(WORK_DIR_NOTE_ENV))


def _gone(state: Dict) -> Optional[bool]:
    """Whether the process of a rank's progress file has ended: known on this host only."""
    if state.get('host') != socket.gethostname() or not state.get('pid'):
        return None
    return not psutil.pid_exists(int(state['pid']))


def peers_known(records: List[Dict], ranks: Dict[int, Dict], rank: int) -> bool:
    """Whether every other rank has either a failure record or a progress file whose process
    is known to have ended (on this host): then nothing more will come."""
    raised = {r.get('rank') for r in records}
    return all(r in raised or _gone(s) for r, s in ranks.items() if r != rank)


def _peer_lines(records: List[Dict], ranks: Dict[int, Dict], rank: int) -> List[str]:
    """What this rank can see of the others: the ranks that failed by themselves (their first
    line and record), those that left no record (ended without a Python exception, or still
    running elsewhere), in rank order."""
    own_cause = [
        r for r in records if r.get('rank') != rank and not waited(r) and not agreed_only(r)
    ]
    lines = []
    for r in own_cause:
        lines.append(f'  rank {r.get("rank")} (host {r.get("host")}, pid {r.get("pid")}) raised '
                     f'{r.get("exc_type")}: {first_lines(shown_message(r), 1)[0]}')
        lines.append(f'    its record: {r.get("traceback_file")}')
    raised = {r.get('rank') for r in records}
    for peer, state in sorted(ranks.items()):
        if peer == rank or peer in raised:
            continue
        done = state.get('completed_iter')
        where = f'rank {peer} (host {state.get("host")}, pid {state.get("pid")})'
        if _gone(state):
            lines.append(f'  {where} ended after iteration {"-" if done is None else done} '
                         'without a Python exception: killed by a signal (out of host memory, '
                         'a kill, the scheduler); its own log or `dmesg` on its host says which')
        elif not own_cause:
            lines.append(f'  {where} left no failure record here (last seen after iteration '
                         f'{"-" if done is None else done}): its own log holds the cause')
    return lines


def rank_screen(work_dir: str, rank: int, wait: float = PEER_WAIT,
                sleep: Callable[[float], None] = time.sleep) -> str:
    """This rank's screen from what ``work_dir`` holds ('' where this rank left no record).

    A rank whose error only says that it waited (a peer lost, a collective timeout) first waits
    up to ``wait`` seconds for the other ranks' records, until each has one or is known to have
    ended, then names them.
    """
    records = read_failures(work_dir)
    own = next((r for r in records if r.get('rank') == rank), None)
    if own is None:
        return ''
    head = f'==== mmddp_ext: rank {rank} failed (what this rank sees) ===='
    whole = f'the whole job: python -m mmddp_ext.diagnose {osp.abspath(work_dir)}'
    how = waited(own)
    if not how and not agreed_only(own):
        return '\n'.join([head, *raised_lines([own]), *refused_lines([own]), whole])
    deadline = time.monotonic() + wait
    ranks = read_ranks(work_dir)
    while not peers_known(records, ranks, rank) and time.monotonic() < deadline:
        sleep(0.2)
        records, ranks = read_failures(work_dir), read_ranks(work_dir)
    done = (ranks.get(rank) or {}).get('completed_iter')
    what = 'timed out waiting for the others' if how == 'timeout' else 'lost its peer'
    lines = [
        head,
        f'rank {rank} (host {own.get("host")}, pid {own.get("pid")}) {what} after iteration '
        f'{"-" if done is None else done}: {own.get("exc_type")}: '
        f'{first_lines(shown_message(own), 1)[0]}',
    ]
    inner = own.get('raised_at')
    if inner:
        what = wait_site(
            [Frame(str(inner.get('file')), int(inner.get('line') or 0), str(inner.get('func')))])
        called = own.get('user_at')
        lines.append(f'  it waited in {what or frame_text(inner)}' +
                     (f', called from {frame_text(called)}' if called else ''))
    peers = _peer_lines(records, ranks, rank)
    lines += ['the other ranks, as this rank sees them:', *peers] if peers else [
        '  no other rank left a record or a progress file here: their own logs hold the cause'
    ]
    return '\n'.join(lines + refused_lines(records + list(ranks.values())) + [whole])


def print_rank_screen(work_dir: str, rank: int, environ: Mapping[str, str] = os.environ) -> None:
    """Print :func:`rank_screen` to stderr unless a front of ours prints the job's diagnosis.
    Never raises: it runs while the process ends."""
    if front_prints_diagnosis(environ):
        return
    try:
        text = rank_screen(work_dir, rank)
    except Exception as e:  # the rank's own traceback is above: never hide it
        text = f'[mmddp_ext] rank {rank}: no screen ({e!r}); python -m mmddp_ext.diagnose ' \
               f'{osp.abspath(work_dir)}'
    if text:
        print(text, file=sys.stderr, flush=True)
