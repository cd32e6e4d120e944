"""One-screen summary of a failed run: ``python -m mmddp_ext.diagnose WORK_DIR``.

Reads the per-rank records written by the training entry (``<work_dir>/failures/``) and names
the first failing rank, the exception and where the full traceback is. ``tools/dist_train.sh``
runs it after a non-zero exit as ``python -m mmddp_ext.diagnose --train-args CONFIG ARGS...``,
which finds the work dir the same way ``dist_train.py`` does.
"""
import argparse
import datetime
import os.path as osp
import sys
from typing import Dict, List, Optional

from .failures import failure_dir, read_failures


def _first_lines(text: str, n: int = 3, width: int = 300) -> List[str]:
    lines = [ln for ln in text.splitlines() if ln.strip()] or ['(no message)']
    return [ln[:width] for ln in lines[:n]]


def summarize(work_dir: str, records: Optional[List[Dict]] = None) -> str:
    """The diagnosis text for ``work_dir`` (pure formatting of the records)."""
    records = read_failures(work_dir) if records is None else records
    head = f'==== mmddp_ext diagnosis of {osp.abspath(work_dir)} ===='
    if not records:
        return '\n'.join([
            head, f'no failure records in {failure_dir(work_dir)}: no rank raised a Python '
            'exception. A rank killed by a signal (exit -9: out of host memory or kill; -6: '
            'abort) leaves none; see the launcher\'s report above.'])
    first = records[0]
    when = datetime.datetime.fromtimestamp(first.get('time', 0)).strftime('%H:%M:%S')
    lines = [head,
             f'first failing rank: {first.get("rank")} (host {first.get("host")}, pid '
             f'{first.get("pid")}, at {when})',
             f'  {first.get("exc_type")}: ' + '\n  '.join(_first_lines(first.get('message', ''))),
             f'  full traceback: {first.get("traceback_file")}']
    lines += _memory_lines(first)
    others = records[1:]
    if others:
        lines.append('then: ' + '; '.join(
            f'rank {r.get("rank")} {r.get("exc_type")}' for r in others))
    return '\n'.join(lines)


def _memory_lines(record: Dict) -> List[str]:
    """Memory numbers and, for an out-of-memory error, the batch that fits."""
    from .memory.oom import is_oom, oom_advice
    lines = []
    now = (record.get('memory') or {}).get('now') or {}
    if now:
        dev = '' if now.get('device_total') is None else (
            f'device {now.get("device")}: allocated {_mib(now.get("allocated"))}, reserved '
            f'{_mib(now.get("reserved"))}, used {_mib(now.get("device_used"))} of '
            f'{_mib(now.get("device_total"))}; ')
        lines.append(f'  memory at failure: {dev}host RSS {_mib(now.get("rss"))} (peak '
                     f'{_mib(now.get("peak_rss"))})')
    oom = record.get('oom')
    if oom is None:  # a record written before records carried the classification
        oom = is_oom(record.get('exc_type', ''), record.get('message', ''),
                     record.get('address_space_limit') is not None)
    if oom:
        lines.insert(0, f'  out of memory on rank {record.get("rank")}')
        lines += [f'  {line}' for line in oom_advice(record)]
    return lines


def _mib(value) -> str:
    return '-' if value is None else f'{value / 2 ** 20:.0f} MiB'


def work_dir_from_train_args(argv: List[str]) -> str:
    """The work dir ``dist_train.py ARGV`` uses (``--work-dir``, the config's, or the default)."""
    from .train import build_parser, default_work_dir
    args, _ = build_parser().parse_known_args(argv)
    if args.work_dir:
        return args.work_dir
    try:
        from .utils.config import load_config
        return default_work_dir(args, load_config(args.config, args.cfg_options))
    except Exception:  # the training run has already said what is wrong with the config
        return default_work_dir(args)


def main(argv: Optional[List[str]] = None) -> int:
    """Print the diagnosis; exit code 0 (it reports, it does not judge)."""
    p = argparse.ArgumentParser(prog='python -m mmddp_ext.diagnose', description=__doc__)
    p.add_argument('work_dir', nargs='?', help='the work dir of the failed run')
    p.add_argument('--train-args', nargs=argparse.REMAINDER,
                   help='the dist_train.py arguments instead of WORK_DIR')
    args = p.parse_args(argv)
    if bool(args.work_dir) == bool(args.train_args):
        p.error('give either WORK_DIR or --train-args CONFIG [ARGS...]')
    work_dir = args.work_dir or work_dir_from_train_args(args.train_args)
    print(summarize(work_dir), flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
