"""One-screen summary of a failed run: ``python -m mmddp_ext.diagnose WORK_DIR``.

Reads what the run left behind (the launcher's report, the ranks' progress files and stack
dumps, the failure records) and names the rank, the cause and the fix; ``tools/dist_train.sh``
runs it after a non-zero exit. What it says, with real output: docs/failures.md.
"""
import datetime
import os.path as osp
import re
from typing import Dict, List, Optional

from ..oom.advice import oom_advice
from ..oom.classify import is_oom
from ..utils.ranks import group_ranks, ranks_text
from ..utils.units import format_mib
from .ddp_errors import ddp_error_lines, mismatch_lines, mismatch_text
from .deaths import (LAUNCHER_STOP, cgroup_count, death_lines, host_memory_total, kernel_log,
                     shared_memory_lines, signal_name, worker_death_lines)
from .frames import raise_site_lines, worker_error_line
from .records import (failure_dir, ranks_dir, read_failures, read_launch_report, read_ranks,
                      stacks_path)
from .spare_records import refused_lines, spare_dir
from .stacks import main_frames, parse_dump, split_ranks


def first_lines(text: str, n: int = 3, width: int = 400) -> List[str]:
    lines = [ln for ln in text.splitlines() if ln.strip()] or ['(no message)']
    return [ln[:width] for ln in lines[:n]]


COLLECTIVE_TIMEOUT = ('Timed out waiting', 'Socket Timeout', 'timed out after',
                      'Watchdog caught collective operation timeout', 'Timeout waiting')
PEER_LOST = ('Connection closed by peer', 'Connection reset by peer', 'Broken pipe',
             'NCCL communicator was aborted', 'ProcessGroupNCCL is aborted')


def waited(record: Dict) -> Optional[str]:
    """'timeout' / 'peer lost' when a rank's exception only says that it waited for others."""
    text = f'{record.get("exc_type", "")}: {record.get("message", "")}'
    if any(k in text for k in COLLECTIVE_TIMEOUT):
        return 'timeout'
    if any(k in text for k in PEER_LOST):
        return 'peer lost'
    return None


def summarize(work_dir: str, records: Optional[List[Dict]] = None,
              ranks: Optional[Dict[int, Dict]] = None, launch: Optional[List[Dict]] = None) -> str:
    """The diagnosis text for ``work_dir``: one screen, the rank, the cause, the fix.

    What it reports, the first that applies:

    * a rank killed by a signal, with no Python exception (the launcher's report,
      ``--launch-report``; kept in ``<work_dir>/ranks/launch.json``): its pid, signal, last
      iteration and memory (:mod:`mmddp_ext.diagnose.deaths`); when its kept stderr says that
      the ranks ran different collectives (gloo aborts the process then), that, not a native
      crash;
    * a hang (a watchdog stack dump in ``<work_dir>/ranks/``, or a collective timeout) when no
      rank raised an error of its own: the rank that did not arrive and where it was, the
      ranks that waited (:mod:`mmddp_ext.diagnose.stacks`);
    * a rank that trained and left no failure record while every rank that raised only lost
      its peer (killed where no launcher reports it: Slurm, processes started by hand);
    * else the failure records (``<work_dir>/failures/``): one of DDP's known errors in our
      words (:mod:`mmddp_ext.diagnose.ddp_errors`), or the first rank that failed by itself
      (not one that only lost its peer; when every rank raised the same, no rank is blamed),
      the exception, where it was raised and the data file it read
      (:mod:`mmddp_ext.diagnose.frames`), and where the full traceback is.

    Ranks that agree are grouped (:mod:`mmddp_ext.utils.ranks`), so the screen stays one screen
    for 1024 ranks.

    Args:
        records: the failure records (default: read from ``work_dir``).
        ranks: the progress files and stack dumps (default: read from ``work_dir``).
        launch: the launcher's failure report (default: the one kept in ``work_dir``).
    """
    records = read_failures(work_dir) if records is None else records
    ranks = _current_run(read_ranks(work_dir) if ranks is None else ranks)
    launch = read_launch_report(work_dir) if launch is None else launch
    head = [f'==== mmddp_ext diagnosis of {osp.abspath(work_dir)} ====']
    # a rank whose work dir refused its records: which dir, its error, where they are instead
    refused = refused_lines(records + list(ranks.values()))
    return '\n'.join(head + _body(work_dir, records, ranks, launch) + refused)


def _body(work_dir: str, records: List[Dict], ranks: Dict[int, Dict],
          launch: List[Dict]) -> List[str]:
    killed = _killed(launch, records)
    if killed:  # no Python exception: the signal is the news, whatever the others raised
        return _killed_lines(work_dir, killed, records, ranks)
    hang = _hang_lines(work_dir, records, ranks)
    if hang:
        return hang
    if not records:
        exits = [f'rank {f.get("rank")} exit code {f.get("exitcode")}' for f in launch]
        return [
            f'no failure records in {failure_dir(work_dir)} (nor in '
            f'{failure_dir(spare_dir(work_dir))}): no rank raised a Python exception' +
            (f' ({"; ".join(exits)})' if exits else '') + '. A rank killed by a signal '
            '(exit -9: out of host memory or kill; -6: abort) leaves none; see the '
            "launcher's report above."
        ]
    return _silent_lines(records, ranks) or raised_lines(records)


def _killed_lines(work_dir: str, killed: List[Dict], records: List[Dict],
                  ranks: Dict[int, Dict]) -> List[str]:
    """The first rank killed by a signal; a collective mismatch when its last stderr lines
    (kept by the launcher) say so: gloo aborts the process then, it is no native crash."""
    first = min(killed, key=lambda f: f.get('time') or 0)
    rank = first.get('rank')
    mismatch = mismatch_text(
        [ranks.get(f.get('rank'), {}).get('stderr_tail') or ''
         for f in killed] + [r.get('message', '') for r in records])
    lines = death_lines(first, ranks.get(rank), kernel_log(first.get('pid') or -1),
                        host_memory_total(), not mismatch, cgroup_count(ranks.get(rank)))
    if mismatch:
        lines += mismatch_lines(mismatch)
        done = {r: s.get('completed_iter') for r, s in ranks.items()}
        if done:
            lines.append(f'  last completed iteration: {_by_rank(done)}')
    if ranks.get(rank, {}).get('stacks'):
        lines.append(f'  stacks: {stacks_path(work_dir, rank)}')
    others = [r for r in records if r.get('rank') != rank]
    if others:
        lines.append('then: ' + _grouped(others))
    return lines


def _by_rank(values: Dict[int, object]) -> str:
    """``ranks 0-1022: 5; rank 1023: 4`` (ranks that agree grouped, the largest group first)."""
    return '; '.join(f'{ranks_text(rs)}: {"-" if v is None else v}'
                     for v, rs in group_ranks(values))


def _grouped(records: List[Dict]) -> str:
    """``ranks 0-5, 7 RuntimeError (peer lost); rank 6 ValueError``: the ranks of ``records``
    grouped by what they raised."""
    what = {
        r.get('rank'):
        f'{r.get("exc_type")}' +
        (f' ({waited(r)})' if waited(r) else ' (agreed to stop: it did not run out '
         'itself)' if agreed_only(r) else '')
        for r in records
    }
    return '; '.join(f'{ranks_text(rs)} {v}' for v, rs in group_ranks(what))


def _same_error(records: List[Dict]) -> bool:
    """Whether several ranks raised the same error (numbers such as ranks aside)."""
    keys = {(r.get('exc_type'), re.sub(r'\d+', 'N', str(r.get('message', '')))) for r in records}
    return len(records) > 1 and len(keys) == 1


def shown_message(record: Dict) -> str:
    """The message to show: a DataLoader worker's own line, without a repeated type."""
    text = worker_error_line(str(record.get('message', '')))
    prefix = f'{record.get("exc_type")}: '
    return text[len(prefix):] if text.startswith(prefix) else text


def raised_lines(records: List[Dict]) -> List[str]:
    """Python exceptions: a known DDP error in our words, else the first rank that failed by
    itself; where it was raised; memory; what the other ranks raised."""
    first = _first_failure(records)
    when = datetime.datetime.fromtimestamp(first.get('time', 0)).strftime('%H:%M:%S')
    where = f'(host {first.get("host")}, pid {first.get("pid")}, at {when})'
    world = first.get('world_size')
    ddp = ddp_error_lines(records, world)
    same = [r for r in records if not waited(r) and not agreed_only(r)]
    if ddp:
        lines = ddp
        explained = {r.get('rank') for r in records if _same_error([r, first])}
    elif _same_error(same) and len(same) == len(records):
        lines = [
            f'{ranks_text(r.get("rank") for r in same)} raised the same error (rank '
            f'{first.get("rank")} {where} shown; no rank is the culprit):',
            f'  {first.get("exc_type")}: ' + '\n  '.join(first_lines(shown_message(first)))
        ]
        explained = {r.get('rank') for r in same}
    else:
        lines = [
            f'first failing rank: {first.get("rank")} {where}',
            f'  {first.get("exc_type")}: ' + '\n  '.join(first_lines(shown_message(first)))
        ]
        explained = {first.get('rank')}
    # a worker's death interrupts the rank wherever it is: where it raised says nothing
    said = str(first.get('message', ''))
    lines += worker_death_lines(said) or shared_memory_lines(said) or raise_site_lines(first)
    lines.append(f'  full traceback: {first.get("traceback_file")}')
    lines += _memory_lines(first)
    others = [r for r in records if r.get('rank') not in explained]
    if others:
        lines.append('then: ' + _grouped(others))
    return lines


def _where(state: Dict) -> str:
    node = state.get('slurm_node')
    host = state.get('host')
    return f'node {node}' if node else f'host {host}'


def _silent_lines(records: List[Dict], ranks: Dict[int, Dict]) -> List[str]:
    """When every rank that raised only lost its peer, and a rank that trained left no record
    (killed by a signal where no launcher reports it: Slurm, hand-started processes): that
    rank, where it ran and its last iteration; [] otherwise."""
    if not records or any(waited(r) != 'peer lost' for r in records):
        return []
    raised = {r.get('rank') for r in records}
    silent = sorted(r for r in ranks if r not in raised)
    if not silent:
        return []
    lines = []
    for rank in silent:
        state = ranks[rank]
        done = state.get('completed_iter')
        lines.append(f'rank {rank} ({_where(state)}, pid {state.get("pid")}) died without a '
                     f'Python exception after iteration {"-" if done is None else done}: killed '
                     f'by a signal (out of host memory, a kill, or the scheduler ending the step, '
                     f'e.g. srun --kill-on-bad-exit) and left no failure record')
    lines.append('then: ' + '; '.join(f'rank {r.get("rank")} lost its peer ({r.get("exc_type")})'
                                      for r in records))
    lines.append('  fix: find the signal: under Slurm `sacct -j JOBID --format=JobID,State,'
                 'ExitCode,NodeList`, on the host `dmesg | grep -i "out of memory"` (the kernel '
                 'killed it) or the job\'s own log')
    return lines


def agreed_only(record: Dict) -> bool:
    """Whether a rank raised only because the ranks agreed that others ran out of memory."""
    ranks = record.get('oom_ranks')
    return ranks is not None and record.get('rank') not in ranks


def _killed(launch: List[Dict], records: List[Dict]) -> List[Dict]:
    """The launcher's failures by a signal that is not its own stop, of ranks that raised
    nothing (a rank that raised and then died by a signal while exiting: its exception is the
    news)."""
    raised = {r.get('rank') for r in records}
    return [
        f for f in launch
        if signal_name(f) and signal_name(f) not in LAUNCHER_STOP and f.get('rank') not in raised
    ]


def rank_at_fault(records: List[Dict], launch: List[Dict]) -> Optional[int]:
    """The rank the diagnosis blames, from the failure records and the launcher's report: the
    first killed by a signal that is not the launcher's own stop and raised nothing, else the
    first that failed by itself (:func:`_first_failure`), else the launcher's first failure."""
    killed = _killed(launch, records)
    if killed:
        return min(killed, key=lambda f: f.get('time') or 0).get('rank')
    if records:
        return _first_failure(records).get('rank')
    return launch[0].get('rank') if launch else None


def _first_failure(records: List[Dict]) -> Dict:
    """The first rank that failed by itself: not one that only lost its peer, nor one that
    stopped because the ranks agreed that another rank ran out of memory."""
    own = [r for r in records if not waited(r) and not agreed_only(r)]
    return (own or [r for r in records if not waited(r)] or records)[0]


def _current_run(ranks: Dict[int, Dict]) -> Dict[int, Dict]:
    """Only the progress files of the latest run (a folder may hold an older, larger one)."""
    if not ranks:
        return ranks
    latest = max(ranks.values(), key=lambda s: s.get('time') or 0).get('run')
    return {r: s for r, s in ranks.items() if s.get('run') == latest}


def _hang_lines(work_dir: str, records: List[Dict], ranks: Dict[int, Dict]) -> List[str]:
    """The hang diagnosis: who did not arrive, where it was, who waited; [] if no hang."""
    dumps = {r: parse_dump(s.get('stacks') or '') for r, s in ranks.items()}
    timed_out = {r: d.timeout for r, d in dumps.items() if d.timeout}
    collective = [r for r in records if waited(r) == 'timeout']
    if not timed_out and not collective:
        return []
    if any(not waited(r) for r in records):
        return []  # a rank raised a real error: that is the news (shown by the caller)
    stacks = {r: main_frames(d, ranks[r].get('main_thread')) for r, d in dumps.items()}
    stacks = {r: f for r, f in stacks.items() if f}  # e.g. stopped while exiting: no frame
    completed = {r: s.get('completed_iter') for r, s in ranks.items()}
    waiting, not_arrived = split_ranks(stacks, completed)
    for record in records:  # its exception says it waited, whatever its stack shows
        waiting.setdefault(
            record.get('rank'), 'a collective that timed out' if waited(record) == 'timeout' else
            'a collective, until its peer went away (then it raised)')
        not_arrived.pop(record.get('rank'), None)
    why = (f'no progress for {_seconds(min(timed_out.values()))} (hang watchdog)' if timed_out else
           'collective timeout on ' + ranks_text(r.get('rank') for r in collective))
    lines = [f'hang: {why}']
    for where, rs in group_ranks(not_arrived):
        lines.append(f'{ranks_text(rs)} did not arrive; {"they were" if len(rs) > 1 else "it was"}'
                     f' in {where}')
    sites = {r: _calling_site(f) for r, f in stacks.items() if r in waiting}
    differ = not not_arrived and len(set(sites.values())) > 1
    if differ:
        lines.append('every rank waited, in different collectives:')
        lines += [f'  {ranks_text(rs)} waited in {site}' for site, rs in group_ranks(sites)]
        lines += mismatch_lines('the stacks show each rank in another collective')[1:]
    elif not not_arrived:
        lines.append('every rank with a stack dump waited in a collective: the stacks do '
                     'not tell which rank is late; compare them below')
    if not differ:
        lines += [f'{ranks_text(rs)} waited in {what}' for what, rs in group_ranks(waiting)]
    if completed:
        lines.append(f'  last completed iteration: {_by_rank(completed)}')
    told = {
        r.get('rank'): f'{r.get("exc_type")}: {first_lines(r.get("message", ""), 1, 160)[0]}'
        for r in collective
    }
    lines += [
        f'  {ranks_text(rs)} {told[rs[0]]}' for _, rs in group_ranks({
            rank: re.sub(r'\d+', 'N', text)
            for rank, text in told.items()
        })
    ]
    missing = sorted(set(completed) - set(stacks) - {r.get('rank') for r in records})
    if missing:
        lines.append(f'  no stack dump from {ranks_text(missing)} (killed before dumping)')
    shown = sorted(not_arrived) or sorted(stacks)
    lines += ([f'  stacks: {stacks_path(work_dir, rank)}' for rank in shown]
              if len(shown) <= 3 else [f'  stacks: {ranks_dir(work_dir)}/rank*.stacks.txt'])
    lines.append(_hang_fix(not_arrived, ranks))
    return lines


def _hang_fix(not_arrived: Dict[int, str], ranks: Dict[int, Dict]) -> str:
    """Where to look; for a rank stopped while it computed the metrics, the bound to raise."""
    computing = {
        r: ranks[r]['phase']
        for r in not_arrived if str(ranks.get(r, {}).get('phase') or '').endswith(' metrics')
    }
    if computing:
        return (f'  fix: {ranks_text(sorted(computing))} was computing the '
                f'{sorted(set(computing.values()))[0]} when its bound ran out: a metric that is '
                'only slow needs a longer one, default_hooks.hang_watchdog=dict('
                'metric_timeout=<seconds>) (automatic: an hour for the first computation, then '
                '10x the longest); a stuck one, look at the line above')
    return ('  fix: look at the line above of the rank that did not arrive (a branch taken on '
            'one rank only, a data loader or file system stall, a deadlock); the bound is '
            "HangWatchdogHook's (default_hooks.hang_watchdog=dict(min_timeout=...))")


def _calling_site(frames: List) -> str:
    """Where a waiting rank called its collective from: the innermost frame outside torch."""
    return str(
        next((f for f in frames if '/torch/' not in f.file.replace('\\', '/')),
             frames[0] if frames else '?'))


def _seconds(hms: str) -> str:
    """``0:02:00.5`` (faulthandler's heading) as ``120 s``."""
    try:
        h, m, sec = hms.split(':')
        return f'{int(h) * 3600 + int(m) * 60 + float(sec):.0f} s'
    except ValueError:
        return hms


def _memory_lines(record: Dict) -> List[str]:
    """Memory numbers and, for an out-of-memory error, the batch that fits."""
    lines = []
    now = (record.get('memory') or {}).get('now') or {}
    if now:
        dev = '' if now.get('device_total') is None else (
            f'device {now.get("device")}: allocated {format_mib(now.get("allocated"))}, reserved '
            f'{format_mib(now.get("reserved"))}, used {format_mib(now.get("device_used"))} of '
            f'{format_mib(now.get("device_total"))}; ')
        lines.append(f'  memory at failure: {dev}host RSS {format_mib(now.get("rss"))} (peak '
                     f'{format_mib(now.get("peak_rss"))})')
    oom = record.get('oom')
    if oom is None:  # a record written before records carried the classification
        oom = is_oom(
            record.get('exc_type', ''), record.get('message', ''),
            record.get('address_space_limit') is not None)
    if oom:
        lines.insert(0, f'  out of memory on rank {record.get("rank")}')
        lines += [f'  {line}' for line in oom_advice(record)]
    return lines
