"""The command line of ``tools/dist_train.py``: its flags.

A light module (argparse and MMEngine's config tools; no torch.distributed, no training code).
The flags that decide the work dir, and the work dir they imply, are
:func:`mmddp_ext.utils.config.add_work_dir_arguments` and
:func:`~mmddp_ext.utils.config.default_work_dir`, which the diagnosis
(:mod:`mmddp_ext.diagnose.program`) uses too.
"""
import argparse
import os
from typing import List, Optional

from ..launcher import ways
from ..utils.config import add_work_dir_arguments


def build_parser() -> argparse.ArgumentParser:
    """The flags of MMPose's ``tools/train.py``, plus ours."""
    p = argparse.ArgumentParser(
        prog='dist_train.py',
        description='Train an MMEngine config (MMPose, MMDetection, ...) on 1..N processes.')
    add_work_dir_arguments(p)  # the config, --work-dir, --cfg-options
    p.add_argument('--resume', nargs='?', const='auto', default=None, metavar='CHECKPOINT',
                   help='resume from CHECKPOINT, or (no value) from the latest one in work_dir')
    p.add_argument('--amp', action='store_true', help='mixed precision (AmpOptimWrapper)')
    p.add_argument('--auto-scale-lr', '--auto_scale_lr', action='store_true',
                   help='scale the LR by the batch size (auto_scale_lr.enable=True)')
    p.add_argument(
        '--launcher', choices=ways.names(), default=None,
        help='job launcher (default: detected, mmddp_ext/launcher/ways: pytorch under torchrun '
        'or with RANK/WORLD_SIZE set, slurm inside a multi-task srun step, mpi under a '
        'multi-process mpirun, else none)')
    p.add_argument('--local-rank', '--local_rank', type=int, default=None,
                   help='accepted for torch.distributed.launch compatibility; LOCAL_RANK wins')
    p.add_argument(
        '--unsafe-load', '--unsafe_load', action='store_true',
        help='load legacy checkpoints with weights_only=False (runs their pickle '
        'code; only for files you trust)')
    p.add_argument(
        '--explain', action='store_true',
        help='print the launch topology, the scaling plan and the node\'s figures, then exit '
        '(reads the config and, for the node figures, two batches of the training data; no '
        'GPU)')
    p.add_argument(
        '--world-size', '--world_size', type=int, default=None,
        help='with --explain: the number of processes to plan for (default: from '
        'the environment, else 1)')
    p.add_argument('--json', action='store_true',
                   help='with --explain: print one JSON object on stdout (all else on stderr)')
    p.add_argument(
        '--memory', action='store_true',
        help='with --explain: also forecast the peak memory of every rank, from a few '
        'real training steps of one process on this machine\'s device (the GPU, '
        'else the CPU)')
    p.add_argument(
        '--device-memory', '--device_memory', default=None, metavar='SIZE',
        help='with --explain --memory: memory per device to plan for, e.g. 24GiB, '
        '23.64GiB, 16000MiB (default: the GPU\'s total; on a CPU the RAM shared by '
        'the ranks of the node)')
    return p


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Parse ``dist_train.py`` arguments."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.memory or args.device_memory is not None) and not args.explain:
        parser.error('--memory and --device-memory forecast without training: add --explain, '
                     'e.g. python tools/dist_train.py CONFIG --explain --memory')
    if args.local_rank is not None and 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args
