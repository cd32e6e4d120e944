"""``NodeLimitsHook``: before the first iteration, each node's /dev/shm and host memory against
what its ranks' loading needs (:mod:`mmddp_ext.node`), so that a node that cannot hold it is
named once, with the fix, before the run hangs or a rank is killed there; and the batch the
model's BatchNorm layers see, where it is below what they need (docs/memory.md, "The node's own
limits")."""
import logging
import random
import socket
from collections import defaultdict
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional

import numpy as np
import torch
from mmengine.dist import all_gather_object
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from ..node.facts import node_facts
from ..node.limits import NodeFacts, NodeLoad, node_figures
from ..node.measure import runner_batchnorm_warning, tensor_bytes
from ..utils.checks import true_or_false
from ..utils.log import log_line
from ..utils.memory_reads import rss_bytes
from ..utils.units import format_bytes

CHECKED = ('shared memory', 'host memory')
SHM_SHARE = 4  # /dev/shm of at least 1/4 of the node's memory is no limit (a host's: 1/2)


def sizes_batches(facts: NodeFacts, workers: int) -> bool:
    """Whether a sample is worth loading to size the batches in flight: only with workers
    (without them no batch passes through /dev/shm) and a /dev/shm smaller than a quarter of
    the node's memory (a container's; Docker's default is 64 MiB). Elsewhere the check loads
    nothing, so training loads exactly what it would without it."""
    if not workers or facts.shm_size is None:
        return False
    return facts.host_memory is None or facts.shm_size * SHM_SHARE < facts.host_memory


def node_warnings(views: List[Dict[str, Any]]) -> List[str]:
    """One line per node whose /dev/shm or host memory cannot hold what its ranks need, from
    every rank's view (:meth:`NodeLimitsHook.view`), in rank order; the ranks of a node are
    those with its host name. Host memory counts each worker at nothing: a lower bound."""
    by_host: Dict[str, List[Dict[str, Any]]] = defaultdict(list)
    for view in views:
        by_host[view['host']].append(view)
    lines = []
    for host, ranks in by_host.items():
        first = ranks[0]
        load = NodeLoad(
            len(ranks), first['workers'], first['prefetch_factor'],
            batch_bytes=max(r['batch_bytes'] for r in ranks),
            process_bytes=max(r['rss'] for r in ranks), worker_bytes=0)
        facts = NodeFacts(host_memory=first['host_memory'], shm_size=first['shm_size'])
        for figure in node_figures(load, facts):
            if figure.name in CHECKED and figure.fits is False:
                least = ' at least' if figure.name == 'host memory' else ''
                lines.append(f'node {host}: {figure.name} needs{least} '
                             f'{format_bytes(int(figure.need))} of its '
                             f'{format_bytes(int(figure.have))} ({figure.how}): {figure.fix}')
    return lines


@HOOKS.register_module()
class NodeLimitsHook(Hook):
    """Names, before the first iteration, a node whose /dev/shm or host memory cannot hold
    what its ranks' loading needs.

    Every rank reads its node (/dev/shm, the cgroup's memory limit), the bytes of one training
    batch (one sample through the pipeline, times the batch size, where
    :func:`sizes_batches`), its DataLoader workers and its own RSS;
    one gather, and rank 0 logs one warning per node that does not fit, with the fix. At the
    first iteration rank 0 also warns where the model's BatchNorm layers that train normalise
    over fewer than 8 samples per step (the per-device batch, or its micro-batches), with
    SyncBN as the fix.
    ``dist_train.py --explain`` shows the same figures with a measured worker.

    The sample is loaded with the random states of ``random``, NumPy and torch put back
    afterwards, so training draws the same augmentations as without the check.

    Args:
        enabled: False turns the check off.

    Example::

        default_hooks = dict(node_limits=dict(enabled=False))
    """

    priority = 'LOW'

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = true_or_false('NodeLimitsHook: enabled', enabled)
        self.warnings: List[str] = []
        self.bn_warning: Optional[str] = None
        self._bn_checked = False

    def view(self, runner, facts: Optional[NodeFacts] = None) -> Dict[str, Any]:
        """This rank's share of its node's loading, and what the node has (``facts``: read
        here unless given)."""
        loader = runner.train_dataloader
        workers = int(getattr(loader, 'num_workers', 0) or 0)
        facts = facts or node_facts()
        batch = None
        if sizes_batches(facts, workers):
            try:
                with _random_states_kept():
                    batch = tensor_bytes(loader.dataset[0]) * int(loader.batch_size or 1)
            except Exception:  # a dataset without indexing: the shared memory stays unknown
                batch = None
        return dict(host=socket.gethostname(), workers=workers,
                    prefetch_factor=int(getattr(loader, 'prefetch_factor', None)
                                        or 2), batch_bytes=batch or 0, rss=rss_bytes(),
                    host_memory=facts.host_memory, shm_size=facts.shm_size)

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        """Once, at the first iteration (the model is in training mode now, its frozen
        BatchNorms in eval mode): rank 0 warns where the BatchNorm layers that train see fewer
        samples per step than they need."""
        if self._bn_checked or not self.enabled:
            return
        self._bn_checked = True
        if runner.rank == 0:
            self.bn_warning = runner_batchnorm_warning(runner)
            if self.bn_warning:
                log_line(self.bn_warning, logging.WARNING)

    def before_train(self, runner) -> None:
        """Gather every rank's view; rank 0 logs the nodes that cannot hold their loading."""
        if not self.enabled:
            return
        views = all_gather_object(self.view(runner))
        self.warnings = node_warnings(views)
        for line in self.warnings:
            log_line(line, logging.WARNING, rank0_only=True)


@contextmanager
def _random_states_kept() -> Iterator[None]:
    """The random states of ``random``, NumPy and torch (CPU) as they were, after the block."""
    states = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            random.setstate(states[0])
            np.random.set_state(states[1])
