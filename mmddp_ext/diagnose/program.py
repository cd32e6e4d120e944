"""``python -m mmddp_ext.diagnose``: the command line of the diagnosis (what it says:
:mod:`mmddp_ext.diagnose.summary`; examples: ``docs/failures.md``)."""
import argparse
import os.path as osp
import sys
from typing import List, Optional

from ..utils.config import add_work_dir_arguments, default_work_dir, load_config
from . import summary
from .records import keep_launch_report


def work_dir_from_train_args(argv: List[str]) -> str:
    """The work dir ``dist_train.py ARGV`` uses (``--work-dir``, the config's, or the default)."""
    # the training flags that decide the work dir (the config first, as dist_train.sh passes
    # it); the others are passed over
    parser = add_work_dir_arguments(argparse.ArgumentParser(add_help=False))
    args, _ = parser.parse_known_args(argv)
    if args.work_dir:
        return args.work_dir
    try:
        return default_work_dir(args, load_config(args.config, args.cfg_options))
    except Exception:  # the training run has already said what is wrong with the config
        return default_work_dir(args)


def main(argv: Optional[List[str]] = None) -> int:
    """Print the diagnosis; exit code 0 (it reports, it does not judge), 2 when the work dir
    does not exist."""
    p = argparse.ArgumentParser(prog='python -m mmddp_ext.diagnose', description=summary.__doc__)
    p.add_argument('work_dir', nargs='?', help='the work dir of the failed run')
    p.add_argument('--launch-report', metavar='PATH',
                   help="the launcher's failure report (JSON; tools/dist_train.sh passes it)")
    p.add_argument('--train-args', nargs=argparse.REMAINDER,
                   help='the dist_train.py arguments instead of WORK_DIR')
    args = p.parse_args(argv)
    if bool(args.work_dir) == bool(args.train_args):
        p.error('give either WORK_DIR or --train-args CONFIG [ARGS...]')
    work_dir = args.work_dir or work_dir_from_train_args(args.train_args)
    launch = keep_launch_report(work_dir, args.launch_report) if args.launch_report else None
    if not osp.isdir(work_dir) and not launch:
        print(
            f'mmddp_ext diagnosis: work dir {osp.abspath(work_dir)} does not exist: the run '
            'never started there, or the path is wrong (give the --work-dir of the run)',
            file=sys.stderr, flush=True)
        return 2
    print(summary.summarize(work_dir, launch=launch), flush=True)
    return 0
