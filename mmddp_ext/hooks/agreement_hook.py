"""``AgreementHook``: before the first iteration, every rank agrees or the job stops with a table.

The comparison and the screen are :mod:`mmddp_ext.dist.agreement`; this hook only builds this
rank's summary, gathers the summaries once and raises on every rank on a mismatch.
"""
import socket
import time
from importlib import metadata
from typing import Any, Dict, List, Optional, Sequence, Tuple

from mmengine.dist import all_gather_object, get_world_size
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS

from ..dist.agreement import (PACKAGES, Disagreement, RanksDisagreeError, canonical, disagreements,
                              format_screen, rank_summary, short_message)


def versions(packages: Sequence[str] = PACKAGES) -> Dict[str, Optional[str]]:
    """``{package: installed version}``, None for a package that is not installed."""
    out = {}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def parameter_shapes(model: Any) -> List[Tuple[str, Tuple[int, ...]]]:
    """``(name, shape)`` of every parameter of the model inside any wrapper, in order."""
    inner = model.module if is_model_wrapper(model) else model
    return [(name, tuple(p.shape)) for name, p in inner.named_parameters()]


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
    (per-node paths excluded, see :data:`~mmddp_ext.dist.agreement.PER_NODE_KEYS`) and the
    versions of torch, mmengine, mmcv, mmpose, mmdet and mmddp_ext; one ``all_gather_object``
    brings every summary to every rank. When they differ, rank 0 logs the screen of
    :func:`~mmddp_ext.dist.agreement.format_screen` and every rank raises
    :class:`~mmddp_ext.dist.agreement.RanksDisagreeError` (rank 0's message is the screen),
    so the job stops before step 1. When they agree, rank 0 logs one line with the time the
    check took.

    Collective: every rank must run it (all ranks gather together; a second gather, of the
    parameter lists, only when the parameters differ).

    Example::

        custom_hooks = [dict(type='AgreementHook')]
    """

    priority = 'VERY_HIGH'

    def __init__(self) -> None:
        self.seconds: Optional[float] = None
        self.summaries: List[Dict[str, Any]] = []

    def before_train(self, runner) -> None:
        """Summarise, gather, compare; raise on every rank when the ranks differ."""
        start = time.perf_counter()
        loader = runner.train_dataloader
        params = parameter_shapes(runner.model)
        mine = rank_summary(
            _length(getattr(loader, 'dataset', None)), _length(loader), params,
            canonical(runner.cfg.to_dict()), versions(), socket.gethostname())
        self.summaries = all_gather_object(mine)
        found = disagreements(self.summaries)
        self.seconds = time.perf_counter() - start
        if not found:
            if runner.rank == 0:
                runner.logger.info(
                    f'[mmddp_ext] {len(self.summaries)} ranks agree: dataset length '
                    f'{mine["dataset length"]}, {mine["iterations per epoch"]} iterations per '
                    f'epoch, parameters {mine["parameters"]}, config {mine["config"]}, same '
                    f'versions (checked in {self.seconds * 1000:.0f} ms)')
            return
        self._stop(runner, found, params)

    def _stop(self, runner, found: Sequence[Disagreement], params) -> None:
        shown = None
        if any(d.field == 'parameters' for d in found):
            leaders = {ranks[0] for d in found if d.field == 'parameters' for _, ranks in d.groups}
            lists = all_gather_object(params if runner.rank in leaders else None)
            shown = {r: p for r, p in enumerate(lists) if p is not None}
        screen = format_screen(found, self.summaries, shown)
        odd = sorted({r for d in found for r in d.odd_ranks})
        fields = [d.field for d in found]
        if runner.rank == 0:
            runner.logger.error(f'[mmddp_ext] {screen}')
            raise RanksDisagreeError(screen, fields, odd)
        raise RanksDisagreeError(short_message(found, get_world_size()), fields, odd)
