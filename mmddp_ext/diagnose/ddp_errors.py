"""DDP's own errors in our words (pure functions over failure records; used by
:mod:`mmddp_ext.diagnose`).

torch names parameters by index; the failure records carry their names (``ddp_param_names``),
so :func:`ddp_error_lines` names them, says what happened and gives the fix, for parameters
that received no gradient, a parameter ready twice, models that differ between ranks, and
collectives that differ between ranks (:func:`mismatch_text`, also read from a dying rank's
kept stderr). Real output: docs/failures.md, "DDP's own errors, by parameter name".
"""
import re
from typing import Dict, List, Optional, Sequence, Tuple

from ..utils.ranks import group_ranks, ranks_text

UNUSED = 'Expected to have finished reduction in the prior iteration'
READY_TWICE = ('Expected to mark a variable ready only once', 'marked as ready twice')
MODEL_DIFFERS = ('DDP expects same model across all ranks',
                 'appears not to match sizes of the same param in process')
COLLECTIVE_MISMATCH = ("Received data size doesn't match expected size",
                       'Is there a distributed collective mismatch',
                       'Detected mismatch between collectives', 'collective mismatch',
                       'op.preamble.length <= op.nbytes')

_UNUSED_INDICES = re.compile(r'Parameter indices which did not receive grad for rank \d+:'
                             r'(?P<indices>[\d ]+)')
_TWICE_INDEX = re.compile(r'Parameter at index (?P<index>\d+)')
_COUNTS = re.compile(r'Rank (?P<rank>\d+) has (?P<n>\d+) params, while rank (?P<other>\d+) '
                     r'has inconsistent (?P<m>\d+) params')
SHOW_NAMES = 6  # parameter names listed before "and N more"

FIND_UNUSED_FIX = ('--cfg-options model_wrapper_cfg.find_unused_parameters=True (DDP then '
                   'walks the autograd graph after every forward to find them: a few per cent '
                   'slower)')


def _message(record: Dict) -> str:
    return str(record.get('message', ''))


def _names(names: Sequence[str]) -> str:
    shown = ', '.join(names[:SHOW_NAMES])
    more = len(names) - SHOW_NAMES
    return shown + (f' and {more} more' if more > 0 else '')


def _name_of(record: Dict, index: int) -> str:
    """The name of DDP's parameter ``index``, from the record's ``ddp_param_names`` (written by
    the entry: :func:`mmddp_ext.ddp.wrapper.ddp_param_names`, in the order DDP indexes them)."""
    names = record.get('ddp_param_names') or []
    return names[index] if 0 <= index < len(names) else f'parameter #{index}'


def _who(raised: Sequence[int], world: Optional[int]) -> str:
    """``ranks 0-1 (every rank: none of them is the culprit)`` or ``rank 1``."""
    every = world is not None and len(set(raised)) == world and world > 1
    return ranks_text(raised) + (' (every rank raised it: no rank is the culprit, the model '
                                 'is)' if every else '')


def unused_lines(records: List[Dict], world: Optional[int]) -> List[str]:
    """Parameters that received no gradient, by name, per group of ranks that agree."""
    hits = [r for r in records if UNUSED in _message(r)]
    if not hits:
        return []
    named = {}
    for r in hits:
        m = _UNUSED_INDICES.search(_message(r))
        idx = [int(i) for i in m.group('indices').split()] if m else []
        named[r.get('rank')] = tuple(_name_of(r, i) for i in idx)
    lines = [f'DDP error on {_who(named, world)}: parameters that received no gradient']
    lines += _names_by_rank(named, '(torch did not list them)')
    lines += [
        '  cause: these parameters took no part in the loss, and DDP waits for a gradient of '
        'every parameter before it can start the next iteration',
        '  fix: remove the unused part from the model (or freeze it: requires_grad=False), or '
        f'let DDP find unused parameters: {FIND_UNUSED_FIX}'
    ]
    return lines


def _names_by_rank(named: Dict, missing: str) -> List[str]:
    """One line of parameter names per group of ranks that named the same (no rank prefix when
    every rank agrees); ``missing`` where torch named none."""
    groups = group_ranks(named)
    return [
        f'  {"" if len(groups) == 1 else ranks_text(ranks) + ": "}'
        f'{_names(names) if names else missing}' for names, ranks in groups
    ]


def ready_twice_lines(records: List[Dict], world: Optional[int]) -> List[str]:
    """A parameter whose gradient DDP saw twice in one iteration."""
    hits = [r for r in records if any(k in _message(r) for k in READY_TWICE)]
    if not hits:
        return []
    named = {}
    for r in hits:
        m = _TWICE_INDEX.search(_message(r))
        named[r.get('rank')] = (_name_of(r, int(m.group('index'))), ) if m else ()
    lines = [
        f'DDP error on {_who(named, world)}: a parameter got its gradient twice in one '
        'iteration (DDP reduces each gradient once)'
    ]
    lines += _names_by_rank(named, '(torch did not name it)')
    lines += [
        '  cause: a module used in several backward passes of one iteration: activation '
        'checkpointing with use_reentrant=True, a module shared by several checkpointed '
        'branches, or find_unused_parameters=True with such a model',
        '  fix: if the model runs the same graph every iteration: --cfg-options '
        'model_wrapper_cfg.static_graph=True; else checkpoint with '
        'torch.utils.checkpoint.checkpoint(..., use_reentrant=False), and drop '
        'find_unused_parameters=True if no parameter is unused'
    ]
    return lines


def _first_difference(ref: Sequence[str], other: Sequence[str]) -> Tuple[int, str, str]:
    """Index of the first differing name and the two names there ('none' past the end)."""
    for i in range(max(len(ref), len(other))):
        a = ref[i] if i < len(ref) else None
        b = other[i] if i < len(other) else None
        if a != b:
            return i, a or 'none', b or 'none'
    return -1, '', ''


def model_differs_lines(records: List[Dict], world: Optional[int]) -> List[str]:
    """Models that differ between ranks: the ranks, counts and first differing parameters."""
    hits = [r for r in records if any(k in _message(r) for k in MODEL_DIFFERS)]
    if not hits:
        return []
    m = next((_COUNTS.search(_message(r)) for r in hits if _COUNTS.search(_message(r))), None)
    lines = [
        'models differ between ranks (DDP compares them when it wraps the model)' +
        (f': rank {m.group("rank")} has {m.group("n")} parameters, rank '
         f'{m.group("other")} has {m.group("m")}' if m else '')
    ]
    names = {
        r.get('rank'): tuple(r['ddp_param_names'])
        for r in records if r.get('ddp_param_names') is not None
    }
    groups = group_ranks(names)
    if len(groups) > 1:
        ref, ref_ranks = groups[0]
        for other, ranks in groups[1:]:
            i, a, b = _first_difference(ref, other)
            lines.append(f'  first difference, parameter {i}: {ranks_text(ranks)} '
                         f'{b}, {ranks_text(ref_ranks)} {a}')
            only = [n for n in other if n not in set(ref)]
            missing = [n for n in ref if n not in set(other)]
            if only:
                lines.append(f'  only on {ranks_text(ranks)}: {_names(only)}')
            if missing:
                lines.append(f'  missing on {ranks_text(ranks)}: {_names(missing)}')
    elif len(groups) == 1 and len(names) > 1:
        lines.append(f'  {ranks_text(names)} have the same parameter names: the shapes differ '
                     '(e.g. a different num_keypoints or channels)')
    lines += [
        '  cause: the ranks built different models: a config, code or checkout that differs '
        'between nodes (a stale copy), or a model that depends on the rank or the host',
        '  fix: run the same config and code on every node (compare `git rev-parse HEAD` and '
        'the config file there); then restart all ranks'
    ]
    return lines


def mismatch_text(texts: Sequence[str]) -> Optional[str]:
    """The first line of ``texts`` that says the ranks ran different collectives, or None."""
    for text in texts:
        for line in str(text).splitlines():
            at = [line.find(k) for k in COLLECTIVE_MISMATCH if k in line]
            if at:  # from the sentence on, without gloo's "[enforce fail at /long/path:N]"
                start = line.rfind('] ', 0, min(at)) + 2 if '] ' in line[:min(at)] else 0
                return line[start:].strip()
    return None


def mismatch_lines(line: str) -> List[str]:
    """What a collective mismatch means and what to check (``line``: torch's or gloo's)."""
    return [
        'the ranks ran different collectives (one rank sent or expected another size): '
        f'{line[:200]}',
        '  cause: usually different data lengths (a rank that reads another copy of the data '
        'on its node, a dataset that depends on the rank) or a rank skipping a step (a branch '
        'taken on one rank only, a skipped backward)',
        "  fix: give every rank the same data (AgreementHook, a default hook of DDPRunner, "
        "compares the ranks' dataset lengths before the first iteration and names the rank "
        'that differs) and the same steps; '
        'TORCH_DISTRIBUTED_DEBUG=DETAIL names the two collectives',
    ]


def ddp_error_lines(records: List[Dict], world: Optional[int] = None) -> List[str]:
    """The diagnosis lines for a known DDP error among ``records``; [] when there is none."""
    for explain in (model_differs_lines, unused_lines, ready_twice_lines):
        lines = explain(records, world)
        if lines:
            return lines
    line = mismatch_text([_message(r) for r in records])
    return mismatch_lines(line) if line else []


__all__ = ['ddp_error_lines', 'mismatch_lines', 'mismatch_text']
