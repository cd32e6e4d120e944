"""Ranks that wait for rank 0's metrics wait with a bound of their own, not the collective timeout.

MMEngine's metrics (``BaseMetric.evaluate``) collect every rank's results, compute the metrics on
rank 0 alone and broadcast them; the other ranks wait for that broadcast in the default process
group, so a metric that takes longer than ``env_cfg.dist_cfg.timeout`` (a COCO evaluation of a
large val set) ends the job in the middle of validation. :class:`PatientEvaluator` runs the same
three steps, with the same public parts of the metric, over a gloo group of its own, made for
this evaluation with the bound its ``wait_timeout`` gives (the hang watchdog's metric bound,
where :class:`~mmddp_ext.runner.DDPRunner` builds it). The results travel through that group
too, not through a folder (MMEngine's default, ``.dist_test/`` under the working directory,
which nodes that share nothing do not see). A metric whose class has its own ``evaluate`` is
called as it is. ``docs/reliability.md``, "Slow metrics".
"""
import logging
from datetime import timedelta
from itertools import chain, zip_longest
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import torch
import torch.distributed as dist
from mmengine.evaluator import BaseMetric, Evaluator
from mmengine.registry import EVALUATOR

from ..utils.log import log_line

DEFAULT_WAIT = 3600.0  # seconds the other ranks wait for rank 0's metrics, without a watchdog


def keeps_stock_evaluate(metric: Any) -> bool:
    """True when ``metric`` evaluates with ``BaseMetric.evaluate`` itself (collect, compute on
    rank 0, broadcast): then its three steps can be run here, with a wait of our own."""
    return isinstance(metric, BaseMetric) and type(metric).evaluate is BaseMetric.evaluate


def to_cpu(data: Any) -> Any:
    """``data`` with every tensor in its lists, tuples and dicts moved to the CPU (as MMEngine
    does to the collected results before ``compute_metrics``)."""
    if isinstance(data, torch.Tensor):
        return data.to('cpu')
    if isinstance(data, (list, tuple)):
        return type(data)(to_cpu(d) for d in data)
    if isinstance(data, dict):
        return {k: to_cpu(v) for k, v in data.items()}
    return data


@EVALUATOR.register_module()
class PatientEvaluator(Evaluator):
    """An ``Evaluator`` whose ranks wait for rank 0's metrics up to ``wait_timeout`` seconds.

    Args:
        metrics: as for MMEngine's ``Evaluator``.
        wait_timeout: seconds the ranks other than 0 wait for rank 0 to compute a metric, or a
            function called at each evaluation that returns them (the hang watchdog's bound).

    Example::

        val_evaluator = dict(type='PatientEvaluator', wait_timeout=7200,
                             metrics=[dict(type='CocoMetric', ann_file='val.json')])
    """

    def __init__(self, metrics: Union[dict, BaseMetric, Sequence],
                 wait_timeout: Union[float, Callable[[], float]] = DEFAULT_WAIT) -> None:
        super().__init__(metrics)
        if not callable(wait_timeout) and not (isinstance(wait_timeout,
                                                          (int, float)) and wait_timeout > 0):
            raise ValueError(f'PatientEvaluator wait_timeout={wait_timeout!r}: give a positive '
                             'number of seconds (or a function that returns one)')
        self.wait_timeout = wait_timeout
        self._told = False

    def wait_seconds(self) -> float:
        """The bound of this evaluation's wait, in seconds."""
        return float(self.wait_timeout() if callable(self.wait_timeout) else self.wait_timeout)

    def evaluate(self, size: int) -> dict:
        """The metrics of all ranks' results (``size``: the dataset's length). All ranks must
        call this."""
        if not dist.is_initialized() or dist.get_world_size() < 2:
            return super().evaluate(size)
        own = [type(m).__name__ for m in self.metrics if not keeps_stock_evaluate(m)]
        if own and not self._told:
            self._told = True
            log_line(
                f'{", ".join(own)} has its own evaluate(): the other ranks wait for its '
                'metrics in the default process group, up to env_cfg.dist_cfg.timeout',
                logging.INFO, rank0_only=True)
        # made by every rank here, in the same order: a collective
        group = dist.new_group(backend='gloo', timeout=timedelta(seconds=self.wait_seconds()))
        try:
            metrics: Dict[str, Any] = {}
            for metric in self.metrics:
                part = (
                    _evaluate(metric, size, group)
                    if keeps_stock_evaluate(metric) else metric.evaluate(size))
                for name in part:
                    if name in metrics:
                        raise ValueError(
                            f'two metrics are both named {name!r} (the second from '
                            f'{type(metric).__name__}): give the metrics different prefixes')
                metrics.update(part)
            return metrics
        finally:
            dist.destroy_process_group(group)


def gather_results(part: list, size: int, group: Optional[Any] = None) -> Optional[List]:
    """Every rank's results on rank 0, in the samplers' order, cut at ``size``; None elsewhere.

    As MMEngine's ``collect_results`` orders them: rank ``r``'s ``i``-th result is sample
    ``i × world_size + r`` (``DefaultSampler``), the padding past ``size`` is dropped, and so
    are results that are None. Through ``group``: no folder has to be shared. All ranks must
    call this.
    """
    parts = [None] * dist.get_world_size(group) if dist.get_rank() == 0 else None
    dist.gather_object(part, parts, dst=0, group=group)
    if parts is None:
        return None
    return [r for r in chain.from_iterable(zip_longest(*parts)) if r is not None][:size]


def _evaluate(metric: BaseMetric, size: int, group: Optional[Any]) -> dict:
    """``BaseMetric.evaluate``'s steps, over ``group``."""
    if not metric.results:
        log_line(
            f'{type(metric).__name__} got no results on this rank: its process() must add '
            'them to self.results', logging.WARNING)
    results = gather_results(metric.results, size, group)
    box = [None]
    if dist.get_rank() == 0:
        computed = metric.compute_metrics(to_cpu(results))
        if metric.prefix:
            computed = {f'{metric.prefix}/{k}': v for k, v in computed.items()}
        box = [computed]
    dist.broadcast_object_list(box, src=0, group=group)
    metric.results.clear()
    return box[0]
