"""The collective of the ranks' agreement: before the first iteration, :func:`agree_or_stop`
compares every rank's view of the job (the pure part is :mod:`mmddp_ext.agreement.compare`):
the DDPRunner before it wraps the model (DDP's own shape check would otherwise stop the job
with torch's message), and :class:`~mmddp_ext.hooks.agreement_hook.AgreementHook` once the training
data is built.
"""
import socket
from importlib import metadata
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from mmengine.dist import all_gather_object, barrier
from mmengine.model import is_model_wrapper

from .compare import (PACKAGES, RanksDisagreeError, canonical, disagreements, format_screen,
                      rank_summary, short_message)


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


def view_of(model: Any, cfg: Any, dataset_length: Optional[int] = None,
            iters_per_epoch: Optional[int] = None,
            starts_at: Optional[str] = None) -> Tuple[Dict[str, Any], list]:
    """This rank's summary (:func:`~mmddp_ext.agreement.compare.rank_summary`) of ``model``
    (wrapped or not) and ``cfg`` (an mmengine ``Config``), and the parameter list behind it."""
    params = parameter_shapes(model)
    plain = cfg.to_dict() if hasattr(cfg, 'to_dict') else dict(cfg)
    return rank_summary(dataset_length, iters_per_epoch, params, canonical(plain), versions(),
                        socket.gethostname(), starts_at), params


def agree_or_stop(summary: Mapping[str, Any], params: Sequence, rank: int,
                  logger: Any = None) -> List[Dict[str, Any]]:
    """Gather every rank's summary and return them; when they differ, rank 0 logs the screen
    and every rank raises :class:`~mmddp_ext.agreement.compare.RanksDisagreeError` (rank 0's
    message is the screen, the others' its headline).

    All ranks must call this: one ``all_gather_object`` of the summaries; only when they differ,
    a second one of the parameter lists (if the parameters differ) and a barrier.
    """
    summaries = all_gather_object(dict(summary))
    found = disagreements(summaries)
    if not found:
        return summaries
    shown = None
    if any(d.field == 'parameters' for d in found):
        leaders = {ranks[0] for d in found if d.field == 'parameters' for _, ranks in d.groups}
        lists = all_gather_object(list(params) if rank in leaders else None)
        shown = {r: p for r, p in enumerate(lists) if p is not None}
    odd = sorted({r for d in found for r in d.odd_ranks})
    fields = [d.field for d in found]
    screen = format_screen(found, summaries, shown) if rank == 0 else None
    if screen is not None and logger is not None:
        logger.error(f'[mmddp_ext] {screen}')
    # no rank leaves before rank 0 has shown the screen: the launcher stops the others as soon
    # as one rank exits
    barrier()
    raise RanksDisagreeError(screen or short_message(found, len(summaries)), fields, odd)
