"""The training losses in the log speak for every rank: the log processor and the pure steps of
the exchange that :class:`~mmddp_ext.hooks.global_loss_hook.GlobalLossHook` runs.

MMEngine logs rank 0's losses alone: a rank that trains on other data, or diverges, does not
show. With ``DDPRunner`` each training loss of a logged line is the mean over the ranks of each
rank's smoothed value (the value the stock processor would log there), with ``loss_rank_min``
and ``loss_rank_max`` beside the total loss. ``default_hooks.global_loss=None`` logs rank 0's
values again.
"""
import math
import numbers
import zlib
from collections import OrderedDict
from typing import Any, Dict, List, Mapping, Optional

from mmengine.registry import LOG_PROCESSORS
from mmengine.runner import LogProcessor

SPREAD_OF = 'loss'  # the total loss gets the ranks' minimum and maximum beside it
MAX_LOSSES = 63  # loss values a line can carry to the other ranks


def is_loss(key: str, value: Any) -> bool:
    """A loss value of the log (``loss``, ``loss_kpt``, ``train/loss_cls``, ...)."""
    return ('loss' in key.rsplit('/', 1)[-1] and isinstance(value, numbers.Real)
            and not isinstance(value, bool))


def over_ranks(tags: List[Mapping[str, Any]], rank: int) -> Dict[str, Any]:
    """Rank ``rank``'s log values with each loss that every rank has replaced by the mean over
    the ranks, and ``<loss>_rank_min`` / ``<loss>_rank_max`` after the total loss. Pure: the
    ranks' values in, the line's values out."""
    mine = tags[rank]
    out: Dict[str, Any] = OrderedDict()
    for key, value in mine.items():
        values = [t.get(key) for t in tags]
        if not is_loss(key, value) or not all(is_loss(key, v) for v in values):
            out[key] = value
            continue
        out[key] = sum(values) / len(values)
        if key.rsplit('/', 1)[-1] == SPREAD_OF:
            out[f'{key}_rank_min'], out[f'{key}_rank_max'] = min(values), max(values)
    return out


def keys_digest(keys: List[str]) -> float:
    """The loss names of a line as one number (exact in a float64) that the ranks compare."""
    return float(zlib.crc32('\n'.join(keys).encode()))


def row_of(keys: List[str], values: List[float]) -> List[float]:
    """What a rank sends: ``[digest, value, ...]`` padded to ``1 + MAX_LOSSES`` numbers (every
    rank sends the same size, whatever it logs; more losses than that send no digest)."""
    if len(keys) > MAX_LOSSES:
        return [math.nan] * (1 + MAX_LOSSES)
    return [keys_digest(keys)] + list(values) + [0.0] * (MAX_LOSSES - len(values))


def losses_of(keys: List[str], rows: List[List[float]]) -> Optional[List[Dict[str, float]]]:
    """Each rank's losses from its gathered row (:func:`row_of`), or None when a rank names
    other losses than this one (or too many)."""
    digest = keys_digest(keys)
    if any(row[0] != digest for row in rows):  # NaN never equals
        return None
    return [dict(zip(keys, row[1:1 + len(keys)])) for row in rows]


@LOG_PROCESSORS.register_module()
class GlobalLossLogProcessor(LogProcessor):
    """MMEngine's ``LogProcessor``; a training line that ``GlobalLossHook`` exchanged
    carries the ranks' mean losses (any other line is as the stock processor makes it).
    Takes ``LogProcessor``'s arguments."""

    exchanged: Optional[tuple] = None  # (iteration, every rank's losses), set by the hook

    def local_losses(self, runner) -> Dict[str, float]:
        """This rank's smoothed training losses, as :meth:`_collect_scalars` makes them."""
        return {
            key[len('train/'):]: float(buffer.mean(self.window_size))
            for key, buffer in runner.message_hub.log_scalars.items()
            if key.startswith('train/') and is_loss(key, 0.0)
        }

    def _collect_scalars(self, custom_cfg: List[dict], runner, mode: str,
                         reserve_prefix: bool = False) -> dict:
        tag = super()._collect_scalars(custom_cfg, runner, mode, reserve_prefix)
        if mode != 'train' or self.exchanged is None or self.exchanged[0] != runner.iter:
            return tag
        tags = [dict(losses) for losses in self.exchanged[1]]
        if reserve_prefix:
            tags = [{f'train/{k}': v for k, v in losses.items()} for losses in tags]
        tags[runner.rank] = tag  # this rank's whole line; the others' losses
        return over_ranks(tags, runner.rank)


def log_processor_cfg(log_processor: Any) -> Any:
    """``log_processor`` with the stock ``LogProcessor`` (named, or implied by no ``type``)
    replaced by :class:`GlobalLossLogProcessor`; any other processor as it is."""
    if not isinstance(log_processor, dict):
        return log_processor
    kind = log_processor.get('type', 'LogProcessor')
    if kind in ('LogProcessor', LogProcessor):
        return dict(log_processor, type='GlobalLossLogProcessor')
    return log_processor
