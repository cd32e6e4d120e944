"""A test-only metric: MMPose's ``CocoMetric`` that computes for ``busy`` more seconds (rank 0
alone computes metrics), as a COCO evaluation of a large val set does."""
import time

from mmengine.registry import METRICS
from mmpose.evaluation.metrics import CocoMetric


@METRICS.register_module()
class SlowCocoMetric(CocoMetric):
    """``CocoMetric`` that sleeps ``busy`` seconds before it computes."""

    def __init__(self, busy: float = 0.0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.busy = busy

    def compute_metrics(self, results: list) -> dict:
        time.sleep(self.busy)
        return super().compute_metrics(results)
