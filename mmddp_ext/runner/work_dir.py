"""The work dir of nodes that share nothing (node-local scratch), before the first iteration:
does every rank see the folder rank 0 writes to, and does every rank have the checkpoint the
run starts from? An unshared work dir is named in one line, and rank 0's starting checkpoint is
sent to the ranks that lack it, so ``--resume`` (a Slurm requeue, an elastic restart) starts
every rank from the same step (docs/launching.md, "Nodes that share nothing").

The functions that take no text are collective: all ranks call them, in the same order.
"""
import logging
import os
import os.path as osp
import socket
import uuid
from datetime import timedelta
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from mmddp_launch.files import atomic_write_bytes

from ..utils.log import log_line
from ..utils.ranks import group_ranks, ranks_text
from ..utils.units import format_bytes

SEND_TIMEOUT = 3600.0  # seconds for sending one file to the ranks that lack it


def unseen_by(folder: str) -> Dict[int, str]:
    """The ranks that do not see a file rank 0 has just written in ``folder`` (made where
    missing), each with its host name; ``{}`` where every rank sees it.

    The file's name is new (a random token), so no cached lookup of a network file system
    can hide it; rank 0 removes it when every rank has looked.
    """
    rank = dist.get_rank()
    box: List[Optional[str]] = [None]
    if rank == 0:
        os.makedirs(folder, exist_ok=True)
        box = [f'.shared-check-{uuid.uuid4().hex}']
        open(osp.join(folder, box[0]), 'w').close()
    dist.broadcast_object_list(box, src=0)  # sent once the file exists
    views: List = [None] * dist.get_world_size()
    dist.all_gather_object(views, (osp.isfile(osp.join(folder, box[0])), socket.gethostname()))
    if rank == 0:
        os.remove(osp.join(folder, box[0]))
    return {r: host for r, (seen, host) in enumerate(views) if not seen}


def send_missing_file(path: str) -> List[int]:
    """Rank 0's file ``path`` written at the same path on the ranks that lack it; returns
    those ranks (``[]`` where none lacks it, or where rank 0 lacks it too).

    The bytes travel over a gloo group (CPU memory, whatever the default backend); each
    receiving rank writes them atomically, so ranks of one node that write the same path
    leave one whole file.
    """
    rank = dist.get_rank()
    have: List = [None] * dist.get_world_size()
    dist.all_gather_object(have, osp.isfile(path))
    missing = [r for r, has in enumerate(have) if not has]
    if not missing or not have[0]:
        return []
    group = dist.new_group(backend='gloo', timeout=timedelta(seconds=SEND_TIMEOUT))
    try:
        size = [osp.getsize(path) if rank == 0 else None]
        dist.broadcast_object_list(size, src=0, group=group)
        data = torch.empty(size[0], dtype=torch.uint8)
        if rank == 0 and size[0]:
            with open(path, 'rb') as f:
                data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
        if size[0]:
            dist.broadcast(data, src=0, group=group)
        if rank in missing:
            atomic_write_bytes(path, data.numpy().tobytes())
    finally:
        dist.destroy_process_group(group)
    return missing


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
