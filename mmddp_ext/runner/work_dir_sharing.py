"""Before the first iteration: does every rank see the work dir rank 0 writes to, and does every
rank have the checkpoint the run starts from? A work dir on node-local scratch is named in one
line, and rank 0's checkpoint is sent to the ranks that lack it, so ``--resume`` (a Slurm
requeue, an elastic restart) starts every rank from the same step (docs/launching.md, "Nodes that
share nothing")."""
import logging
import os.path as osp
from typing import Any, List, Optional

import torch.distributed as dist

from ..ddp.shared_folder import send_missing_file, unseen_by
from ..utils.log import log_line
from ..utils.ranks import group_ranks, ranks_text
from ..utils.units import format_bytes

LAST_CHECKPOINT = 'last_checkpoint'  # MMEngine's file naming a work dir's latest checkpoint


def not_shared_line(work_dir: str, unseen: dict) -> str:
    """The one line for a work dir that the ranks in ``unseen`` (rank -> host) do not see."""
    where = '; '.join(f'{ranks_text(rs)} on {host}' for host, rs in group_ranks(unseen))
    return (f'the work dir {work_dir} is not shared: rank 0 writes there, and {where} '
            'cannot see it. Training, validation and --resume do not need it (rank 0 sends the '
            'checkpoint a run starts from), but checkpoints and logs stay on rank 0\'s node '
            'and each node\'s diagnosis names only its own ranks: for one folder that holds '
            'everything, give --work-dir a folder every node sees')


def share_work_dir(runner: Any) -> List[int]:
    """Check ``runner.work_dir`` on every rank and bring the starting checkpoint (``resume``
    or ``load_from``) to every rank that lacks it; returns the ranks it was sent to. All ranks
    must call this, before loading."""
    unseen = unseen_by(runner.work_dir)
    if unseen:
        log_line(not_shared_line(runner.work_dir, unseen), logging.WARNING, rank0_only=True)
    start = _starting_checkpoint(runner.cfg, runner.work_dir)
    if start is None or '://' in start:  # nothing to start from, or not a local file
        return []
    sent = send_missing_file(start)
    if sent:
        log_line(
            f'sent {start} ({format_bytes(osp.getsize(start))}) from rank 0 to '
            f'{ranks_text(sent)}, which did not have it', logging.INFO, rank0_only=True)
    return sent


def _starting_checkpoint(cfg: Any, work_dir: str) -> Optional[str]:
    """The checkpoint rank 0 starts from: ``load_from``, or with ``resume`` and no
    ``load_from``, the one ``last_checkpoint`` names (that file first sent where missing)."""
    load_from = cfg.get('load_from')
    if load_from is not None or not cfg.get('resume'):
        return load_from
    marker = osp.join(work_dir, LAST_CHECKPOINT)
    send_missing_file(marker)
    box = [None]
    if dist.get_rank() == 0 and osp.isfile(marker):
        with open(marker) as f:
            box = [f.read().strip() or None]
    dist.broadcast_object_list(box, src=0)
    return box[0]
