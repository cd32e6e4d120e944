"""A runner whose training plan does not fit still evaluates: MMPose's and MMDetection's own
``tools/test.py`` build the whole config's runner (through ``runner_type``) and only call
``test()``, on however many GPUs the user has. The plan is checked when the runner is built;
what it refuses (a global batch that the world size does not divide, a bad ``scaling`` key)
is raised by ``train()``, before anything trains, and never by ``val()`` or ``test()``."""
from typing import Any, Optional, Tuple

from ..errors import ScalingError
from ..scaling.apply import CheckedScaling, check_scaling


def checked_or_refused(
        cfg: Any, world_size: int, cuda: bool,
        distributed: bool) -> Tuple[Optional[CheckedScaling], Optional[ScalingError]]:
    """:func:`~mmddp_ext.scaling.apply.check_scaling`, or the error it raised."""
    try:
        return check_scaling(cfg, world_size, cuda, distributed), None
    except ScalingError as e:
        return None, e


class TrainsOnlyWithAPlan:
    """Mixin for a ``Runner``: ``train()`` raises ``training_refused`` (set when the runner was
    built without a plan because the plan was refused); evaluation runs as it would."""

    training_refused: Optional[ScalingError] = None

    def train(self) -> Any:
        """The runner's training, unless its plan was refused."""
        if self.training_refused is not None:
            raise self.training_refused
        return super().train()
