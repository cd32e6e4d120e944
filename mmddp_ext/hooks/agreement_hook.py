"""``AgreementHook``: before the first iteration, every rank agrees or the job stops with a table.

The comparison and the screen are :mod:`mmddp_ext.agreement.compare`, the collective
:func:`mmddp_ext.agreement.collective.agree_or_stop`; this hook only builds this rank's summary
once the training data is built.
"""
import time
from typing import Any, Dict, List, Optional

from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from ..agreement.collective import agree_or_stop, view_of
from ..utils.checks import true_or_false


def _length(obj: Any) -> Optional[int]:
    try:
        return len(obj)
    except TypeError:  # an iterable dataset or loader has no length
        return None


@HOOKS.register_module()
class AgreementHook(Hook):
    """Compares every rank's view of the job before the first iteration.

    In ``before_train`` each rank summarises the training dataset's length, the iterations
    per epoch, the model's parameter names, shapes and count, a digest of the resolved config
    (per-node paths and per-rank devices excluded, see
    :data:`~mmddp_ext.agreement.compare.NOT_COMPARED_KEYS`) and the
    versions of torch, mmengine, mmcv, mmpose, mmdet and mmddp_ext; one ``all_gather_object``
    brings every summary to every rank. When they differ, rank 0 logs the screen of
    :func:`~mmddp_ext.agreement.compare.format_screen` and every rank raises
    :class:`~mmddp_ext.agreement.compare.RanksDisagreeError`, so the job stops before step 1.
    When they agree, rank 0 logs one line with the time the check took (also in
    :attr:`seconds`).

    Collective: every rank must run it.

    Args:
        enabled: False turns the check off, here and before the model is wrapped (then DDP's
            own errors reach the diagnosis, explained by :mod:`mmddp_ext.diagnose.ddp_errors`).

    Example (on by default under DDPRunner; ``rank_agreement=None`` removes it)::

        default_hooks = dict(rank_agreement=dict(enabled=False))
    """

    priority = 'VERY_HIGH'

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = true_or_false('AgreementHook: enabled', enabled)
        self.seconds: Optional[float] = None
        self.summaries: List[Dict[str, Any]] = []

    def before_train(self, runner) -> None:
        """Summarise, gather, compare; raise on every rank when the ranks differ."""
        if not self.enabled:
            return
        start = time.perf_counter()
        loader = runner.train_dataloader
        mine, params = view_of(runner.model, runner.cfg, _length(getattr(loader, 'dataset', None)),
                               _length(loader), f'epoch {runner.epoch}, iteration {runner.iter}')
        self.summaries = agree_or_stop(mine, params, runner.rank, runner.logger)
        self.seconds = time.perf_counter() - start
        if runner.rank == 0:
            runner.logger.info(
                f'[mmddp_ext] {len(self.summaries)} ranks agree: dataset length '
                f'{mine["dataset length"]}, {mine["iterations per epoch"]} iterations per epoch, '
                f'parameters {mine["parameters"]}, config {mine["config"]}, starting at '
                f'{mine["starts at"]}, same versions '
                f'(checked in {self.seconds * 1000:.0f} ms)')
