"""Whether every rank sees the folder rank 0 writes to, and rank 0's files sent to the ranks that
do not: the work dir of nodes that share nothing (node-local scratch), found before the first
iteration (docs/launching.md, "Nodes that share nothing").

All functions here are collective: all ranks must call them, in the same order.
"""
import os
import os.path as osp
import socket
import uuid
from datetime import timedelta
from typing import Dict, List, Optional

import torch
import torch.distributed as dist

from ..utils.io import atomic_write_bytes

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
