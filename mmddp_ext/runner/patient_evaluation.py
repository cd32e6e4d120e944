"""The runner builds its evaluators as :class:`~mmddp_ext.ddp.evaluator.PatientEvaluator`: the
ranks other than 0 wait for rank 0's metrics up to the hang watchdog's metric bound, not the
process group's collective timeout (``docs/reliability.md``, "Slow metrics")."""
from typing import Any

from mmengine.evaluator import Evaluator

from ..ddp.evaluator import DEFAULT_WAIT, PatientEvaluator


class WaitsForMetricsPatiently:
    """Mixin for a ``Runner``: a plain ``Evaluator`` it builds (from ``val_evaluator`` or
    ``test_evaluator``, a metric, a list of metrics or ``dict(metrics=...)``) becomes a
    :class:`PatientEvaluator` over the same metrics; an evaluator of another class is kept."""

    def build_evaluator(self, evaluator: Any) -> Any:
        built = super().build_evaluator(evaluator)
        if type(built) is Evaluator:
            return PatientEvaluator(built.metrics, wait_timeout=self.metric_wait)
        return built

    def metric_wait(self) -> float:
        """Seconds the ranks wait for rank 0's metrics: the ``metric_wait()`` of the first hook
        that has one (:class:`~mmddp_ext.hooks.HangWatchdogHook`, a layer above this one),
        else :data:`DEFAULT_WAIT`."""
        bound = next(
            (h.metric_wait for h in self.hooks if callable(getattr(h, 'metric_wait', None))), None)
        return bound() if bound is not None else DEFAULT_WAIT
