"""Evaluation over the ranks: metrics that wait with a bound of their own, and samplers that
keep every sample counted once (docs/failures.md, "A stuck rank").

MMEngine's metrics (``BaseMetric.evaluate``) collect every rank's results, compute on rank 0
and broadcast; the other ranks wait in the default process group, so a metric slower than
``env_cfg.dist_cfg.timeout`` ends the job mid-validation. :class:`PatientEvaluator` runs the
same three steps over a gloo group of its own, with the bound its ``wait_timeout`` gives, and
gathers the results through that group rather than a folder that nodes may not share.

``DefaultSampler`` and torch's ``DistributedSampler`` lay samples out as MMEngine's result
collection expects, so padded copies are dropped and the metrics are the same on any number of
ranks; another sampler on a dataset the world size does not divide may count a sample twice:
:func:`padding_warning` says so before the loop runs.
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

ORDER_KEEPING = ('DefaultSampler', 'DistributedSampler')  # their rank layout is collect's

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


def padding_warning(split: str, sampler: str, samples: int, world_size: int) -> Optional[str]:
    """The warning for ``split``'s sampler (its class name) on ``samples`` samples and
    ``world_size`` ranks, or None when every sample counts once."""
    if world_size < 2 or samples % world_size == 0 or sampler in ORDER_KEEPING:
        return None
    padded = -(-samples // world_size) * world_size
    return (f'{split}_dataloader.sampler is {sampler}: with {world_size} ranks its {samples} '
            f'samples become {padded}, and MMEngine drops the extra ones only in '
            f"DefaultSampler's order, so a sample may count twice in the metrics and another "
            f'not at all: use {split}_dataloader.sampler=dict(type=\'DefaultSampler\', '
            'shuffle=False), or a set whose size the number of ranks divides')


def _check(loop: Any, split: str, world_size: int) -> None:
    loader = getattr(loop, 'dataloader', None)
    dataset = getattr(loader, 'dataset', None)
    try:
        samples = len(dataset)
    except TypeError:  # no length: nothing to pad
        return
    warning = padding_warning(split,
                              type(getattr(loader, 'sampler', None)).__name__, samples, world_size)
    if warning:
        log_line(warning, logging.WARNING, rank0_only=True)


class RankEvaluation:
    """Mixin for a ``Runner``: how its val and test loops evaluate over the ranks.

    An evaluator it builds from a config (a metric, a list of metrics or
    ``dict(metrics=...)`` for the stock ``Evaluator``) is a :class:`PatientEvaluator` over the
    same metrics; an evaluator object, or one of another class, is kept as it is. The val and
    test loops it builds are checked by :func:`padding_warning`.
    """

    def build_evaluator(self, evaluator: Any) -> Any:
        built = super().build_evaluator(evaluator)
        if type(built) is Evaluator and built is not evaluator:
            return PatientEvaluator(built.metrics, wait_timeout=self.metric_wait)
        return built

    def metric_wait(self) -> float:
        """Seconds the ranks wait for rank 0's metrics: the ``metric_wait()`` of the first hook
        that has one (:class:`~mmddp_ext.hooks.HangWatchdogHook`), else :data:`DEFAULT_WAIT`."""
        bound = next(
            (h.metric_wait for h in self.hooks if callable(getattr(h, 'metric_wait', None))), None)
        return bound() if bound is not None else DEFAULT_WAIT

    def build_val_loop(self, loop: Any) -> Any:
        built = super().build_val_loop(loop)
        _check(built, 'val', self.world_size)
        return built

    def build_test_loop(self, loop: Any) -> Any:
        built = super().build_test_loop(loop)
        _check(built, 'test', self.world_size)
        return built
