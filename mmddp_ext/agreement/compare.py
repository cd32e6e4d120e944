"""Before the first iteration, every rank's view of the job must be the same.

Each rank summarises what it is about to train (:func:`rank_summary`): the training dataset's
length and iterations per epoch, the model's parameters (count, and a digest of names and
shapes), a digest of the resolved config, the versions of the stack and, once a checkpoint is
loaded, the epoch and iteration training starts at. The summaries are
gathered once (:class:`~mmddp_ext.hooks.AgreementHook`); :func:`disagreements` compares
them and :func:`format_screen` turns what differs into one screen, which stays one screen for
1024 ranks: ranks that agree are grouped (:func:`~mmddp_ext.utils.ranks.group_ranks`) and
only the groups that differ are named.

Config keys excluded from the digest (:data:`PER_NODE_KEYS`) are paths that may legitimately
differ from node to node (each node's own copy of the data, its own scratch work folder, its
own copy of a checkpoint): what such a path holds is checked through the dataset length and
the model's parameters, not through its spelling. ``launcher`` is excluded too (Slurm and
torchrun ranks of one job may say it differently), and so are the keys that name a rank's
own device (:data:`PER_RANK_KEYS`), which differ by design. See docs/launching.md.
"""
import hashlib
import json
import re
import textwrap
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..utils.ranks import group_ranks, ranks_text

PER_NODE_KEYS = frozenset(
    {'work_dir', 'data_root', 'ann_file', 'data_prefix', 'load_from', 'launcher'})
# a rank's own device, wherever a config names it (DDP's device_ids and output_device,
# MMDetection 2's gpu_ids, a local_rank copied into a config): never the same on two ranks
PER_RANK_KEYS = frozenset({'device_ids', 'output_device', 'gpu_ids', 'local_rank'})
NOT_COMPARED_KEYS = PER_NODE_KEYS | PER_RANK_KEYS
PACKAGES = ('torch', 'mmengine', 'mmcv', 'mmpose', 'mmdet', 'mmddp_ext')
FIXES = {
    'dataset length':
    'every rank must read the same annotation file: compare data_root and '
    'ann_file on the nodes named (a stale or partial copy of the data?)',
    'iterations per epoch':
    'every rank must read the same data with the same batch size and '
    'sampler: compare the data and the command lines on the nodes named',
    'parameters':
    'every rank must build the same model: the same config, the same code '
    '(custom_imports, mmpose/mmdet versions) and the same checkout on every node',
    'config':
    'start every node with the same config file and the same --cfg-options (the '
    'same checkout of the configs)',
    'starts at':
    'every rank must start from the same checkpoint: a node that cannot read the '
    'one --resume or load_from names starts from another step; give every node the same '
    'checkpoint (a work dir every node sees)',
    'version':
    'install the same versions on every node, e.g. pip install {package}=={value}',
}
_ADDRESS = re.compile(r' at 0x[0-9a-fA-F]+')
WIDTH = 100  # characters per line of the screen
_SHOWN_GROUPS = 4  # value groups shown per field; the rest are counted
_SHOWN_SPANS = 6  # rank spans written per rank set; the rest are counted
_SHOWN_DIFFS = 3  # first differing parameters / config keys shown
NOT_COMPARED = ('host', 'config sections')  # carried along, not compared


class RanksDisagreeError(RuntimeError):
    """Raised on every rank when the ranks' summaries differ before the first iteration.

    Attributes:
        fields: the fields that differ (e.g. ``['dataset length']``).
        ranks: the ranks outside the largest group of some differing field.
    """

    def __init__(self, message: str, fields: Sequence[str] = (), ranks: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.fields = list(fields)
        self.ranks = sorted(int(r) for r in ranks)

    def __reduce__(self):  # picklable with its fields (elastic's error files)
        return type(self), (str(self), self.fields, self.ranks)


@dataclass(frozen=True)
class Disagreement:
    """One field on which the ranks differ.

    Attributes:
        field: what differs (``'dataset length'``, ``'version mmcv'``, ...).
        groups: ``(value, ranks)`` pairs, the largest group first.
    """
    field: str
    groups: Tuple[Tuple[Any, Tuple[int, ...]], ...]

    @property
    def odd_ranks(self) -> Tuple[int, ...]:
        """The ranks outside the largest group."""
        return tuple(r for _, ranks in self.groups[1:] for r in ranks)


def digest(obj: Any) -> str:
    """A short, stable digest (12 hex digits) of a JSON-able value."""
    text = json.dumps(obj, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def canonical(value: Any, exclude: frozenset = NOT_COMPARED_KEYS) -> Any:
    """``value`` as plain JSON-able data that is the same in every process for the same config:
    dict keys in ``exclude`` dropped at any depth, classes and functions by their qualified
    name, other objects by their ``repr`` without memory addresses."""
    if isinstance(value, Mapping):
        return {str(k): canonical(v, exclude) for k, v in value.items() if k not in exclude}
    if isinstance(value, (list, tuple)):
        return [canonical(v, exclude) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, type) or callable(value):
        return f'{getattr(value, "__module__", "")}.{getattr(value, "__qualname__", value)}'
    return _ADDRESS.sub('', repr(value))


def config_sections(cfg: Mapping) -> Dict[str, str]:
    """The digest of each top-level key of a (canonical) config."""
    return {key: digest(value) for key, value in sorted(cfg.items())}


def rank_summary(dataset_length: Optional[int], iters_per_epoch: Optional[int],
                 params: Sequence[Tuple[str, Tuple[int, ...]]], cfg: Mapping,
                 versions: Mapping[str, Optional[str]], host: str = '',
                 starts_at: Optional[str] = None) -> Dict[str, Any]:
    """What one rank is about to train, small enough to gather from every rank.

    Args:
        dataset_length: ``len`` of the training dataset (None if it has none).
        iters_per_epoch: ``len`` of the training dataloader (None if it has none).
        params: ``(name, shape)`` of every parameter of the unwrapped model, in order.
        cfg: the resolved config as plain data (see :func:`canonical`).
        versions: ``{package: version or None}``.
        host: this rank's host name (carried along to name where odd ranks run).
        starts_at: where training starts on this rank (``'epoch 1, iteration 2'``, after a
            resume), where known.

    Returns:
        ``{field: value}``; :func:`disagreements` compares these. The host and the config's
        per-section digests (to say which sections differ) ride along, not compared.
    """
    summary: Dict[str, Any] = {
        'dataset length': dataset_length,
        'iterations per epoch': iters_per_epoch,
        'parameters': f'{len(params)} tensors, {sum(_numel(s) for _, s in params)} values, '
        f'digest {digest([[n, list(s)] for n, s in params])}',
        'config': digest(cfg),
    }
    if starts_at is not None:
        summary['starts at'] = starts_at
    summary.update({f'version {p}': v for p, v in versions.items()})
    summary['config sections'] = config_sections(cfg)
    summary['host'] = host
    return summary


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def disagreements(summaries: Sequence[Mapping[str, Any]]) -> List[Disagreement]:
    """The fields on which the ranks' summaries (index = rank) differ, in field order."""
    fields = [f for f in summaries[0] if f not in NOT_COMPARED] if summaries else []
    found = []
    for field in fields:
        groups = group_ranks({rank: s.get(field) for rank, s in enumerate(summaries)})
        if len(groups) > 1:
            found.append(Disagreement(field, tuple(groups)))
    return found


def first_param_differences(mine: Sequence[Tuple[str, Tuple[int, ...]]],
                            theirs: Sequence[Tuple[str, Tuple[int, ...]]],
                            limit: int = _SHOWN_DIFFS) -> List[str]:
    """The first parameters that differ between two ``(name, shape)`` lists, as lines."""
    a, b = dict((n, tuple(s)) for n, s in mine), dict((n, tuple(s)) for n, s in theirs)
    lines = []
    for name in list(a) + [n for n in b if n not in a]:
        if a.get(name) != b.get(name):
            lines.append(f'{name}: {_shape(a.get(name))} vs {_shape(b.get(name))}')
        if len(lines) == limit:
            break
    return lines


def _shape(shape: Optional[Tuple[int, ...]]) -> str:
    return 'missing' if shape is None else f'({", ".join(map(str, shape))})'


def differing_sections(summaries: Sequence[Mapping[str, Any]], a: int, b: int) -> List[str]:
    """The top-level config keys whose digests differ between ranks ``a`` and ``b``."""
    sa, sb = summaries[a].get('config sections', {}), summaries[b].get('config sections', {})
    return sorted(k for k in set(sa) | set(sb) if sa.get(k) != sb.get(k))


def _hosts(ranks: Sequence[int], hosts: Sequence[str]) -> str:
    names = sorted({hosts[r] for r in ranks if hosts[r]})
    if not names:
        return ''
    shown = ', '.join(names[:3]) + (f' +{len(names) - 3} more' if len(names) > 3 else '')
    return f' (host{"s" if len(names) > 1 else ""} {shown})'


def format_screen(
        found: Sequence[Disagreement], summaries: Sequence[Mapping[str, Any]],
        params: Optional[Mapping[int, Sequence[Tuple[str, Tuple[int, ...]]]]] = None) -> str:
    """The one screen every rank stops with: which ranks differ, in what, the values side by
    side and the fix.

    Args:
        found: from :func:`disagreements` (not empty).
        summaries: every rank's summary (index = rank), with its host.
        params: ``{rank: [(name, shape), ...]}`` of at least the first rank of each group of
            the ``'parameters'`` field, to show the first differing parameters.
    """
    hosts = [s.get('host') or '' for s in summaries]
    lines = textwrap.wrap(_headline(found, len(summaries)), WIDTH, subsequent_indent='  ')
    for d in found:
        lines.append(f'  {d.field}:')
        for value, ranks in d.groups[:_SHOWN_GROUPS]:
            lines.append(f'    {_value(value):<44} {ranks_text(ranks, _SHOWN_SPANS)}'
                         f'{_hosts(ranks, hosts) if ranks is not d.groups[0][1] else ""}')
        rest = d.groups[_SHOWN_GROUPS:]
        if rest:
            lines.append(f'    ... {len(rest)} more values on '
                         f'{ranks_text([r for _, rs in rest for r in rs], _SHOWN_SPANS)}')
        lines += ['    ' + line for line in _details(d, summaries, params)]
        lines += textwrap.wrap('fix: ' + _fix(d), WIDTH, initial_indent='    ',
                               subsequent_indent='      ')
    return '\n'.join(lines)


def _value(value: Any) -> str:
    return 'missing' if value is None else str(value)


def _details(d: Disagreement, summaries, params) -> List[str]:
    """The first differences behind a digest: parameter names and shapes, config sections."""
    base = d.groups[0][1][0]
    lines = []
    for _, ranks in d.groups[1:_SHOWN_GROUPS]:
        other = ranks[0]
        if d.field == 'parameters' and params and base in params and other in params:
            diffs = first_param_differences(params[base], params[other])
            lines += [f'first differences, rank {base} vs rank {other}:'
                      ] + ['  ' + x for x in diffs]
        elif d.field == 'config':
            keys = differing_sections(summaries, base, other)
            lines.append(f'sections that differ, rank {base} vs rank {other}: '
                         f'{", ".join(keys) or "none at the top level"}')
    return lines


def _fix(d: Disagreement) -> str:
    if d.field.startswith('version '):
        return FIXES['version'].format(
            package=d.field.split(' ', 1)[1], value=_value(d.groups[0][0]))
    return FIXES.get(d.field, 'start every rank from the same command, code and data')


def _headline(found: Sequence[Disagreement], world_size: int) -> str:
    odd = sorted({r for d in found for r in d.odd_ranks})
    verb = 'differs' if len(odd) == 1 else 'differ'
    return (f'ranks disagree before the first iteration, stopping every rank: '
            f'{ranks_text(odd, _SHOWN_SPANS)} '
            f'of {world_size} {verb} in {", ".join(d.field for d in found)}')


def short_message(found: Sequence[Disagreement], world_size: int) -> str:
    """The screen's headline, for the ranks other than 0 (rank 0 carries the screen)."""
    return f'{_headline(found, world_size)}; the table is in rank 0\'s log'


__all__ = [
    'Disagreement', 'PACKAGES', 'PER_NODE_KEYS', 'RanksDisagreeError', 'canonical', 'digest',
    'disagreements', 'first_param_differences', 'format_screen', 'rank_summary', 'short_message'
]
