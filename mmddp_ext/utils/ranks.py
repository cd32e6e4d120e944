"""Rank sets as short text, so a screen about 1024 ranks stays one screen."""
from typing import Dict, Hashable, Iterable, List, Mapping, Optional, Tuple, TypeVar

T = TypeVar('T', bound=Hashable)


def rank_spans(ranks: Iterable[int], most: Optional[int] = None) -> str:
    """Sorted ranks, runs of three or more folded: ``rank_spans([0, 1, 2, 3, 5, 6])`` is
    ``'0-3, 5, 6'``. With ``most``, at most that many spans are written and the rest counted:
    ``rank_spans([0, 2, 4, 6], most=2)`` is ``'0, 2 and 2 more'``."""
    ordered = sorted(set(ranks))
    spans: List[str] = []
    start = prev = None
    for rank in ordered + [None]:
        if start is not None and (rank is None or rank != prev + 1):
            spans.extend(
                map(str, range(start, prev + 1)) if prev - start < 2 else [f'{start}-{prev}'])
            start = None
        if rank is not None and start is None:
            start = rank
        prev = rank
    if most is not None and len(spans) > most:
        shown = spans[:most]
        rest = len(ordered) - sum(_count(span) for span in shown)
        return f'{", ".join(shown)} and {rest} more'
    return ', '.join(spans)


def _count(span: str) -> int:
    first, _, last = span.partition('-')
    return int(last or first) - int(first) + 1


def ranks_text(ranks: Iterable[int], most: Optional[int] = None) -> str:
    """``'rank 3'`` for one rank, ``'ranks 0-3, 5'`` for several (``most``: as in
    :func:`rank_spans`)."""
    ordered = sorted(set(ranks))
    word = 'rank' if len(ordered) == 1 else 'ranks'
    return f'{word} {rank_spans(ordered, most)}'


def group_ranks(values: Mapping[int, T]) -> List[Tuple[T, Tuple[int, ...]]]:
    """Ranks grouped by equal value, the largest group first (ties: lowest rank first).

    Example: ``group_ranks({0: 'a', 1: 'a', 2: 'b'}) == [('a', (0, 1)), ('b', (2,))]``.
    """
    groups: Dict[T, List[int]] = {}
    for rank in sorted(values):
        groups.setdefault(values[rank], []).append(rank)
    ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), item[1][0]))
    return [(value, tuple(ranks)) for value, ranks in ordered]


__all__ = ['group_ranks', 'rank_spans', 'ranks_text']
