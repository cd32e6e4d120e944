"""``--explain``'s node section: what one node's ranks and their DataLoader workers need of its
host memory, /dev/shm and cores, and the batch each BatchNorm layer sees, against what this
node has (:mod:`mmddp_ext.node`), with the fix for a figure that does not fit
(docs/memory.md, "The node's own limits")."""
import os
from typing import Any, Dict, List, Mapping, Optional

import torch

from ..node.facts import node_facts
from ..node.limits import NodeLoad, node_figures
from ..node.measure import measure_loading, training_batchnorms
from ..node.threads import threads_per_process
from ..utils.units import format_bytes

MEMORY = ('host memory', 'shared memory')


def threads_per_rank(environ: Mapping[str, str], ranks_per_node: int, world_size: int,
                     cores: Optional[int], workers: int, torch_threads: int) -> int:
    """The intra-op threads each rank will compute with, as ``tools/dist_train.py`` sets them:
    ``OMP_NUM_THREADS`` where the user set it; else, with several ranks, the node's cores
    shared, less one per worker (:func:`~mmddp_ext.node.threads.threads_per_process`); else
    (one process) torch's own count."""
    shared = threads_per_process(environ, ranks_per_node, cores, workers)
    if shared is None:
        try:
            return max(1, int(environ['OMP_NUM_THREADS']))
        except ValueError:
            return torch_threads
    return shared if world_size > 1 else torch_threads


def node_report(cfg: Any, world_size: int, nnodes: int, per_device_batch: int) -> Dict[str, Any]:
    """The node section of ``--explain`` (JSON-ready): ranks per node, this node's facts and
    the four figures."""
    ranks = -(-world_size // max(1, nnodes))
    loader = cfg.train_dataloader
    workers = int(loader.get('num_workers', 0) or 0)
    sample = measure_loading(cfg, per_device_batch)
    batchnorms = training_batchnorms(cfg)
    facts = node_facts()
    load = NodeLoad(
        ranks_per_node=ranks, num_workers=workers,
        prefetch_factor=int(loader.get('prefetch_factor') or 2), batch_bytes=sample.batch_bytes,
        process_bytes=sample.process_bytes, worker_bytes=sample.worker_bytes,
        threads_per_process=threads_per_rank(os.environ, ranks, world_size, facts.cpus, workers,
                                             torch.get_num_threads()),
        bn_batch=per_device_batch if batchnorms else None)
    return dict(ranks_per_node=ranks, host_memory=facts.host_memory, shm_size=facts.shm_size,
                cpus=facts.cpus, training_batchnorms=batchnorms, not_measured=sample.not_measured
                or None, figures=[f.to_dict() for f in node_figures(load, facts)])


def render_node(node: Dict[str, Any]) -> List[str]:
    """The node section as lines under the plan table."""
    lines = [
        f'node: {node["ranks_per_node"]} rank(s) on each; this node has '
        f'{format_bytes(node["host_memory"])} of memory, /dev/shm '
        f'{format_bytes(node["shm_size"])}, {node["cpus"]} core(s)'
    ]
    for f in node['figures']:
        mark = {True: 'ok', False: 'DOES NOT FIT', None: '?'}[f['fits']]
        lines.append(f'  {f["name"]:<16} {_amount(f):<28} {mark:<12} {f["how"]}')
    if node.get('not_measured'):
        lines.append(f'  not measured: {node["not_measured"]}')
    return lines  # the fix of a figure that does not fit is among the plan's warnings


def _amount(figure: Dict[str, Any]) -> str:
    need, have = figure['need'], figure['have']
    if figure['name'] in MEMORY:
        return f'{_bytes(need)} of {_bytes(have)}'
    if figure['name'] == 'threads':
        return f'{_count(need)} of {_count(have)} cores'
    return f'{_count(have)} per device (>= {_count(need)})'


def _bytes(n: Optional[float]) -> str:
    return '?' if n is None else format_bytes(int(n))


def _count(n: Optional[float]) -> str:
    return '-' if n is None else f'{n:g}'
