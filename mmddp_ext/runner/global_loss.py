"""The training losses in the log speak for every rank.

MMEngine logs rank 0's losses alone (mmcv 1.x averaged them over the ranks): a rank that trains
on other data, or diverges, does not show. :class:`GlobalLossLogProcessor` is MMEngine's
``LogProcessor`` whose training losses are the mean over the ranks of each rank's smoothed
value (the value the stock processor would log there), with ``loss_rank_min`` and
``loss_rank_max`` beside the total loss. The ranks exchange their values once per logged line
(one gather of a few numbers, on the iterations where ``LoggerHook`` logs, which every rank
calls), never per iteration. ``DDPRunner`` uses it where a config asks for the stock
``LogProcessor``; ``log_processor.global_losses=False`` logs rank 0's values again.
"""
import numbers
import zlib
from collections import OrderedDict
from typing import Any, Dict, List, Mapping, Optional

import torch
from mmengine.dist import all_gather, get_world_size
from mmengine.registry import LOG_PROCESSORS
from mmengine.runner import LogProcessor

SPREAD_OF = 'loss'  # the total loss gets the ranks' minimum and maximum beside it


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


@LOG_PROCESSORS.register_module()
class GlobalLossLogProcessor(LogProcessor):
    """MMEngine's ``LogProcessor``; the training losses it logs are the ranks' mean.

    Args:
        global_losses: False logs rank 0's own values, as the stock processor does.
        *args, **kwargs: ``LogProcessor``'s.
    """

    def __init__(self, *args, global_losses: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.global_losses = global_losses

    def _collect_scalars(self, custom_cfg: List[dict], runner, mode: str,
                         reserve_prefix: bool = False) -> dict:
        tag = super()._collect_scalars(custom_cfg, runner, mode, reserve_prefix)
        if not self.global_losses or mode != 'train' or get_world_size() < 2:
            return tag
        keys = [k for k, v in tag.items() if is_loss(k, v)]
        rows = all_gather(
            torch.tensor([keys_digest(keys)] + [float(tag[k]) for k in keys], dtype=torch.float64))
        tags = losses_of(keys, [row.tolist() for row in rows])
        if tags is None:  # the ranks log different losses: each logs its own
            return tag
        tags[runner.rank] = tag  # this rank's whole line; the others' losses
        return over_ranks(tags, runner.rank)


def keys_digest(keys: List[str]) -> float:
    """The loss names of a line as one number (exact in a float64) that the ranks compare."""
    return float(zlib.crc32('\n'.join(keys).encode()))


def losses_of(keys: List[str], rows: List[List[float]]) -> Optional[List[Dict[str, float]]]:
    """Each rank's losses from its gathered row (``[digest, value, ...]``), or None when a rank
    names other losses than this one."""
    digest = keys_digest(keys)
    if any(row[0] != digest or len(row) != len(keys) + 1 for row in rows):
        return None
    return [dict(zip(keys, row[1:])) for row in rows]


def log_processor_cfg(log_processor: Any) -> Any:
    """``log_processor`` with the stock ``LogProcessor`` (named, or implied by no ``type``)
    replaced by :class:`GlobalLossLogProcessor`; any other processor as it is."""
    if not isinstance(log_processor, dict):
        return log_processor
    kind = log_processor.get('type', 'LogProcessor')
    if kind in ('LogProcessor', LogProcessor):
        return dict(log_processor, type='GlobalLossLogProcessor')
    return log_processor
