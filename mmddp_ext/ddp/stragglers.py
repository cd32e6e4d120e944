"""Per-rank speed: this rank's iteration, data and forward times, and the rank that is slower.

:class:`IterationClock` times this rank's iterations locally (no collective);
:class:`~mmddp_ext.hooks.RankMemoryHook` sends its medians with the memory sample it gathers
anyway; :func:`find_straggler` (pure) names the rank that is slower than the others in one
such sample, and why, and :class:`StragglerWatch` warns only when the same rank is found slow
for the same reason in ``patience`` samples in a row (one noisy interval names nobody).

In synchronous data parallel training every rank waits for the slowest in the gradient
all-reduce, so the *iteration* times of all ranks are about equal; what tells the
slow rank apart is the part of the iteration it spends alone: the time waiting for its next
batch (data: the loader) and the forward pass (compute). The forward pass is timed on the host:
exact on a CPU; on a GPU, whose kernels run asynchronously, it is the time to launch them, so a
slow GPU may go unnamed. See docs/memory.md.
"""
import statistics
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

MIN_SHARE = 0.1  # an excess below this share of the iteration is not worth a warning
SPEED_KEYS = ('iter_time_s', 'data_time_s', 'forward_time_s')


class IterationClock:
    """Times this rank's training iterations: total, waiting for data, in the forward pass.

    Call :meth:`start` when an epoch begins, :meth:`batch_ready` when a batch arrives (before
    the iteration runs), :meth:`iteration_done` when it ended, and :meth:`take` to get the
    medians since the last take. :meth:`attach` times the model's forward passes inside
    iterations (a validation forward is not counted).

    Args:
        clock: seconds, monotonic (``time.perf_counter`` unless a test gives another).
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self._last: Optional[float] = None
        self._ready: Optional[float] = None
        self._forward = 0.0
        self._forward_start: Optional[float] = None
        self._rows: List[tuple] = []
        self._handles: list = []

    def attach(self, module: Any) -> None:
        """Time ``module``'s forward passes (torch forward pre- and post-hooks)."""
        self._handles = [
            module.register_forward_pre_hook(lambda *a: self._forward_begins()),
            module.register_forward_hook(lambda *a: self._forward_ends())
        ]

    def detach(self) -> None:
        """Remove the forward hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _forward_begins(self) -> None:
        if self._ready is not None:
            self._forward_start = self.clock()

    def _forward_ends(self) -> None:
        if self._forward_start is not None:
            self._forward += self.clock() - self._forward_start
            self._forward_start = None

    def start(self) -> None:
        """An epoch begins: the next batch's wait is counted from now."""
        self._last = self.clock()

    def batch_ready(self) -> None:
        """The batch of this iteration arrived."""
        self._ready = self.clock()
        self._forward = 0.0

    def iteration_done(self) -> None:
        """The iteration ended: one row (iteration, data, forward seconds)."""
        now = self.clock()
        if self._last is not None and self._ready is not None:
            self._rows.append((now - self._last, self._ready - self._last, self._forward))
        self._last, self._ready = now, None

    def take(self) -> Dict[str, Any]:
        """Medians of the iterations since the last take: ``iter_time_s``, ``data_time_s``,
        ``forward_time_s`` (None without iterations) and ``timed_iters``."""
        rows, self._rows = self._rows, []
        out: Dict[str, Any] = {'timed_iters': len(rows)}
        for i, key in enumerate(SPEED_KEYS):
            out[key] = statistics.median(r[i] for r in rows) if rows else None
        return out


@dataclass(frozen=True)
class Straggler:
    """A rank slower than the others.

    Attributes:
        rank: the slow rank; host: its host.
        part: ``'data'`` (waiting for its batches: the loader) or ``'compute'`` (forward).
        seconds: its median of that part; others: the other ranks' median of it.
        iter_time: the job's median iteration time (every rank waits for the slowest).
        message: the warning, one line.
    """
    rank: int
    host: str
    part: str
    seconds: float
    others: float
    iter_time: float
    message: str


def check_factor(factor: Any) -> float:
    """``straggler_factor`` validated: a number above 1 (or None to switch the check off)."""
    if factor is None:
        return None
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 1:
        raise ValueError(f'RankMemoryHook straggler_factor={factor!r} must be a number above 1 '
                         '(how many times slower than the other ranks a rank may be before it '
                         'is named), e.g. straggler_factor=1.5, or None to switch it off')
    return float(factor)


def check_patience(patience: Any) -> int:
    """``straggler_patience`` validated: a positive int."""
    if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
        raise ValueError(f'RankMemoryHook straggler_patience={patience!r} must be a positive '
                         'integer (how many samples in a row must find the same rank slow '
                         'before it is named), e.g. straggler_patience=3')
    return patience


class StragglerWatch:
    """Names a straggler once it is found in ``patience`` samples in a row.

    Each call of :meth:`see` takes one gathered sample (every rank's medians over one interval);
    a rank that :func:`find_straggler` finds slow for the same part in ``patience`` consecutive
    samples is returned once (each (rank, part) once per run); a sample that finds another rank,
    another part or nobody starts the count again.

    Args:
        factor: as in :func:`find_straggler`; patience: consecutive samples (positive int).
    """

    def __init__(self, factor: float, patience: int) -> None:
        self.factor, self.patience = factor, patience
        self._streak: Optional[tuple] = None
        self._count = 0
        self._named: set = set()

    def see(self, samples: Sequence[Mapping[str, Any]]) -> Optional[Straggler]:
        """The straggler to warn about now, or None."""
        found = find_straggler(samples, self.factor)
        key = None if found is None else (found.rank, found.part)
        self._count = self._count + 1 if key == self._streak else 1
        self._streak = key
        if key is None or self._count < self.patience or key in self._named:
            return None
        self._named.add(key)
        if self.patience == 1:
            return found
        return replace(found, message=f'{found.message} (slow in {self._count} samples in a row)')


def find_straggler(samples: Sequence[Mapping[str, Any]], factor: float,
                   min_share: float = MIN_SHARE) -> Optional[Straggler]:
    """The rank whose data or forward time exceeds the other ranks' median by ``factor``.

    Args:
        samples: per rank, ``rank``, ``host`` and the medians of :meth:`IterationClock.take`.
        factor: how many times the others' median a rank's part must exceed.
        min_share: and the excess must be at least this share of the job's median iteration
            time (a loader 3× slower than the others' but 1 ms per iteration costs nothing).

    Returns:
        The slowest such rank (by its excess), or None.
    """
    timed = [s for s in samples if s.get('iter_time_s') is not None]
    if len(timed) < 2:
        return None
    iter_time = statistics.median(s['iter_time_s'] for s in timed)
    worst = None
    for part, key in (('data', 'data_time_s'), ('compute', 'forward_time_s')):
        for s in timed:
            others = statistics.median(o[key] for o in timed if o is not s)
            excess = s[key] - others
            if s[key] > factor * others and excess >= min_share * iter_time:
                if worst is None or excess > worst[0]:
                    worst = (excess, s, part, key, others)
    if worst is None:
        return None
    excess, s, part, key, others = worst
    return Straggler(s['rank'], s.get('host', ''), part, s[key], others, iter_time,
                     _message(s, part, s[key], others, iter_time, factor))


def _message(s: Mapping[str, Any], part: str, seconds: float, others: float, iter_time: float,
             factor: float) -> str:
    what = ('waiting for its batches (data loading)'
            if part == 'data' else 'in the forward pass (compute)')
    fix = ('more train_dataloader.num_workers on that node, faster storage or a lighter '
           'pipeline there' if part == 'data' else
           'check that node\'s device (clock, temperature, other processes on it)')
    return (f'straggler: rank {s["rank"]} (host {s.get("host", "?")}) is slower than the others: '
            f'{part}: {seconds * 1000:.0f} ms per iteration {what} vs {others * 1000:.0f} ms '
            f'on the other ranks (median over {s.get("timed_iters", "?")} iterations, above '
            f'{factor:g}×); every rank waits for it: iteration {iter_time * 1000:.0f} ms. '
            f'fix: {fix}')


def plot_speed(history: Sequence[Sequence[Mapping[str, Any]]], path: str) -> Optional[str]:
    """Per-rank median iteration time (solid) and data time (dashed) over iterations, as a PNG;
    None when nothing was timed."""
    points: Dict[int, List[tuple]] = {}
    for samples in history:
        for s in samples:
            if s.get('iter_time_s') is not None:
                points.setdefault(s['rank'], []).append(
                    (s['iter'], s['iter_time_s'] * 1000, s['data_time_s'] * 1000))
    if not points:
        return None
    import matplotlib  # here: a plot is drawn once a run, and matplotlib is slow to import
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for rank in sorted(points):
        xs, its, ds = zip(*points[rank])
        line, = ax.plot(xs, its, marker='o', label=f'rank {rank} iteration')
        ax.plot(xs, ds, linestyle='--', color=line.get_color(), label=f'rank {rank} data')
    ax.set_xlabel('iteration')
    ax.set_ylabel('median time per iteration (ms)')
    ax.set_title('mmddp_ext: iteration and data time per rank')
    ax.grid(alpha=0.3)
    ax.legend(fontsize='small')
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
