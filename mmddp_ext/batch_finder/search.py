"""Find the largest per-device batch that fits (pure).

:func:`search_max_batch` is the search behind ``scaling.max_batch_per_device='auto'``. It knows
nothing of torch or of ranks: ``fits(batch)`` runs one trial and returns the answer *all ranks
agreed on* (the MIN over ranks of "it fitted"), so every rank sees the same answers and takes
the same path. The first trial is the largest useful batch (often it fits: one trial); after
that a bisection between the largest batch known to fit and the smallest known to fail, so at
most ``1 + ceil(log2(upper))`` trials are run. (The finder that runs the trials and stores
the result is :mod:`mmddp_ext.batch_finder.finder`; cutting a batch into micro-batches is
:mod:`mmddp_ext.utils.batch`.) Pure standard library.
"""
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, List, Mapping, Optional, Tuple

from ..utils.checks import positive_int


@dataclass(frozen=True)
class Trial:
    """One trial of the search: the per-device batch, whether it fitted on every rank and
    how long it took (seconds)."""

    batch: int
    fits: bool
    seconds: float


@dataclass(frozen=True)
class SearchResult:
    """The outcome of :func:`search_max_batch`.

    Attributes:
        max_batch: The largest per-device batch that fitted on every rank (0: none did).
        upper: The largest batch that was worth trying.
        trials: Every trial, in order.
    """

    max_batch: int
    upper: int
    trials: Tuple[Trial, ...] = field(default_factory=tuple)

    @property
    def seconds(self) -> float:
        """Time spent in trials."""
        return sum(t.seconds for t in self.trials)

    def to_dict(self) -> dict:
        """JSON-ready."""
        out = asdict(self)
        out['trials'] = [asdict(t) for t in self.trials]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> 'SearchResult':
        """Inverse of :meth:`to_dict`."""
        return cls(
            int(data['max_batch']), int(data['upper']),
            tuple(
                Trial(int(t['batch']), bool(t['fits']), float(t['seconds']))
                for t in data.get('trials', ())))


def max_trials(upper: int) -> int:
    """The most trials :func:`search_max_batch` runs for ``upper``: ``1 + ceil(log2(upper))``."""
    return 1 + math.ceil(math.log2(upper)) if upper > 1 else 1


def search_max_batch(upper: int, fits: Callable[[int], bool],
                     progress: Optional[Callable[[int, Trial], None]] = None,
                     clock: Callable[[], float] = time.monotonic) -> SearchResult:
    """The largest batch in ``1..upper`` for which ``fits`` is true.

    Assumes that a batch that fits means every smaller one fits too (memory grows with the
    batch).

    Args:
        upper: The largest batch worth trying (the samples per device per optimizer step).
        fits: Runs one trial; must return the answer agreed by all ranks.
        progress: Called after every trial with ``(trial number, trial)``.
        clock: Seconds, for the trials' durations.

    Returns:
        The result; ``max_batch`` is 0 when not even a batch of 1 fitted.

    Raises:
        ValueError: if ``upper`` is not a positive int.
    """
    positive_int('upper', upper, hint=': the largest per-device batch worth trying, e.g. 64')
    trials: List[Trial] = []

    def run(batch: int) -> bool:
        start = clock()
        ok = bool(fits(batch))
        trials.append(Trial(batch, ok, round(clock() - start, 3)))
        if progress is not None:
            progress(len(trials), trials[-1])
        return ok

    if run(upper):
        return SearchResult(upper, upper, tuple(trials))
    good, bad = 0, upper
    while bad - good > 1:
        middle = (good + bad) // 2
        if run(middle):
            good = middle
        else:
            bad = middle
    return SearchResult(good, upper, tuple(trials))
