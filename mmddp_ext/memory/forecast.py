"""Forecast the memory of every rank of a DDP run before training (pure arithmetic, no torch).

``dist_train.py CONFIG --explain --memory`` measures a few training steps of one process
(:func:`mmddp_ext.batch_finder.trials.measure_steps`); here :func:`fit_line` fits a line
through their peaks, :func:`build_forecast` adds what every rank holds beyond it
(:class:`Cause`) and :func:`largest_batch` reads the largest per-device batch that fits. How
each number is obtained, with real output: docs/memory.md, 'Memory forecast before training'.
"""
import math
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..errors import UserError
from ..utils.units import BYTES_PER_UNIT, MIB

# Points within this many MiB of the line are on it: the peak RSS of one CPU step moves by a
# few MiB between identical steps (glibc's heap, pages; 5 MiB seen on the demo) ...
NOISE_MIB = 8.0
# ... or within this fraction of the rise between the smallest and the largest batch, or of
# the largest peak measured: a bend that small changes no forecast that matters.
LINEARITY = 0.1
PEAK_NOISE = 0.01

_SIZE = re.compile(r'^\s*([+-]?[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$', re.IGNORECASE)


class ForecastError(UserError, ValueError):
    """A bad ``--device-memory`` value, or a device too small for the measured model."""


def parse_size(text: str, name: str = '--device-memory') -> float:
    """A memory size in MiB: ``24GiB``, ``23.64GiB``, ``16000MiB``, ``512M``; a bare number
    is MiB. ``KB``/``MB``/``GB``/``TB`` are decimal (10**9 bytes per GB), the others binary.

    Raises:
        ForecastError: for anything else, zero or negative, naming the value and an example.
    """
    match = _SIZE.match(str(text))
    unit = match[2].lower() if match else None
    if match is None or (unit and unit not in BYTES_PER_UNIT):
        raise ForecastError(f'{name}={text!r} is not a memory size: give a number and a unit, '
                            f'e.g. {name} 24GiB (or 23.64GiB, 16000MiB)')
    mib = float(match[1]) * (BYTES_PER_UNIT[unit] / MIB if unit else 1.0)  # bare: MiB
    if not mib > 0 or not math.isfinite(mib):
        raise ForecastError(f'{name}={text!r} must be a positive size, e.g. {name} 24GiB')
    return mib


def trial_batches(batch: int) -> List[int]:
    """The per-device batches to measure for a planned ``batch``: a quarter, a half and the
    whole of it (distinct, at least two): ``trial_batches(32) == [8, 16, 32]``,
    ``trial_batches(1) == [1, 2]``."""
    if batch < 1:
        raise ValueError(f'batch={batch!r} must be a positive int, e.g. 32')
    out = sorted({max(1, batch // 4), max(1, batch // 2), batch})
    return out if len(out) > 1 else [1, 2]


@dataclass(frozen=True)
class Fit:
    """``peak ≈ fixed + per_sample × batch`` (MiB) through measured ``(batch, peak)`` points.

    Attributes:
        fixed: The intercept: what a step holds with no sample.
        per_sample: The slope: MiB per sample of the per-device batch.
        points: The measured ``(batch, peak)`` points, by batch.
        residual: The largest distance of a point from the line (MiB).
        linear: Whether every point is within ``max(NOISE_MIB, LINEARITY × rise,
            PEAK_NOISE × largest peak)`` of it.
        slopes: The smallest and the largest slope between neighbouring points; the forecast
            is this range when the points are not linear.
    """

    fixed: float
    per_sample: float
    points: Tuple[Tuple[int, float], ...]
    residual: float
    linear: bool
    slopes: Tuple[float, float]

    def peak(self, batch: int) -> Tuple[float, float, float]:
        """The forecast peak at ``batch``: ``(low, fit, high)``; low == high == fit when the
        points are linear, else extrapolated from the largest measured point with the
        smallest and the largest slope."""
        mid = self.fixed + self.per_sample * batch
        if self.linear:
            return mid, mid, mid
        last_batch, last_peak = self.points[-1]
        ends = [last_peak + s * (batch - last_batch) for s in self.slopes]
        return min(ends + [mid]), mid, max(ends + [mid])


def fit_line(points: Sequence[Tuple[int, float]]) -> Fit:
    """Least-squares line through ``(batch, peak_mib)`` points (at least 2 distinct batches).

    Raises:
        ValueError: fewer than two distinct batches, or a batch below 1.
    """
    pts = tuple(sorted((int(b), float(p)) for b, p in points))
    if len({b for b, _ in pts}) < 2 or pts[0][0] < 1:
        raise ValueError(f'points={list(points)!r}: need peaks at two or more different '
                         f'batches >= 1, e.g. [(2, 900.0), (4, 950.0)]')
    n = len(pts)
    mean_b = sum(b for b, _ in pts) / n
    mean_p = sum(p for _, p in pts) / n
    var = sum((b - mean_b)**2 for b, _ in pts)
    slope = sum((b - mean_b) * (p - mean_p) for b, p in pts) / var
    fixed = mean_p - slope * mean_b
    residual = max(abs(p - (fixed + slope * b)) for b, p in pts)
    rise = abs(pts[-1][1] - pts[0][1])
    pair = [(p2 - p1) / (b2 - b1) for (b1, p1), (b2, p2) in zip(pts, pts[1:]) if b2 != b1]
    return Fit(
        fixed=fixed, per_sample=slope, points=pts, residual=residual, linear=residual
        <= max(NOISE_MIB, LINEARITY * rise,
               PEAK_NOISE * max(p for _, p in pts)), slopes=(min(pair), max(pair)))


def largest_batch(fit: Fit, device_mib: float, reserve_mib: float,
                  extra_mib: float = 0.0) -> Optional[int]:
    """The largest per-device batch whose forecast peak (the high end when not linear) plus
    ``extra_mib`` leaves ``reserve_mib`` of ``device_mib`` free; 0 when not even one sample
    does; None when memory does not grow with the batch (no limit can be read from the fit).

    Example: ``fixed=1000, per_sample=50`` on 4096 MiB with 409.6 kept free and 300 of
    extras: ``floor((4096 - 409.6 - 300 - 1000) / 50) = 47``.
    """
    room = device_mib - reserve_mib - extra_mib
    lines = [(fit.fixed, fit.per_sample)]
    if not fit.linear:  # the high end: lines through the largest point with each slope
        last_batch, last_peak = fit.points[-1]
        lines += [(last_peak - s * last_batch, s) for s in fit.slopes]
    answers = []
    for base, slope in lines:
        if slope > 0:
            answers.append(math.floor((room - base) / slope + 1e-9))
        elif base > room:
            answers.append(0)
    return max(0, min(answers)) if answers else None


@dataclass(frozen=True)
class Cause:
    """One term of a rank's memory beyond the fit.

    Attributes:
        name: ``process_context``, ``gradient_bucket_copy``, ``communication_buffers`` or
            ``stray_contexts``.
        mib: MiB per rank (for ``stray_contexts``: the largest of ``per_rank``).
        estimate: False when measured or counted from the model, True when estimated.
        how: How it was obtained, one line.
        single: Whether one process without DDP holds it too (the per-process context).
        per_rank: For causes that differ by rank (stray contexts): MiB of each rank.
    """

    name: str
    mib: float
    estimate: bool
    how: str
    single: bool = False
    per_rank: Optional[Tuple[float, ...]] = None

    def on_rank(self, rank: int) -> float:
        """MiB this cause adds on ``rank``."""
        return self.per_rank[rank] if self.per_rank is not None else self.mib


@dataclass(frozen=True)
class Forecast:
    """The memory forecast of every rank; see ``docs/memory.md`` for the keys.

    ``predicted_peak_mib[r] = fixed + per_sample × batch + Σ causes on rank r`` (the fit's
    high end when the points are not linear: ``predicted_range_mib``).
    """

    device_mib: float
    device_how: str
    world_size: int
    batch: int
    fit: Fit
    causes: Tuple[Cause, ...]
    reserve_mib: float
    predicted_peak_mib: Tuple[float, ...]
    predicted_range_mib: Optional[Tuple[Tuple[float, float], ...]]
    predicted_single_mib: float
    max_batch_single: Optional[int]
    max_batch_ddp: Optional[int]
    method: str
    seconds: float
    warnings: Tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> Dict[str, Any]:
        """The ``memory`` object of ``--explain --json``."""
        r1 = lambda x: round(x, 1)  # noqa: E731
        return dict(
            device_mib=r1(self.device_mib), device_how=self.device_how, world_size=self.world_size,
            per_device_batch_size=self.batch, fixed_mib=r1(self.fit.fixed),
            per_sample_mib=round(self.fit.per_sample, 2), ddp_extra_mib={
                c.name:
                dict(
                    value=r1(c.mib), estimate=c.estimate, how=c.how, single=c.single,
                    **({
                        'per_rank': [r1(v) for v in c.per_rank]
                    } if c.per_rank is not None else {}))
                for c in self.causes
            }, predicted_peak_mib=[r1(v) for v in self.predicted_peak_mib], predicted_range_mib=None
            if self.predicted_range_mib is None else [[r1(lo), r1(hi)]
                                                      for lo, hi in self.predicted_range_mib],
            predicted_single_mib=r1(self.predicted_single_mib), reserve_mib=r1(self.reserve_mib),
            max_batch_single=self.max_batch_single, max_batch_ddp=self.max_batch_ddp,
            fit=dict(points=[[b, r1(p)] for b, p in self.fit.points],
                     residual_mib=r1(self.fit.residual), linear=self.fit.linear,
                     slopes=[round(s, 2) for s in self.fit.slopes
                             ]), method=self.method, seconds=round(self.seconds,
                                                                   1), warnings=list(self.warnings))


def build_forecast(fit: Fit, causes: Sequence[Cause], device_mib: float, device_how: str,
                   reserve_mib: float, world_size: int, batch: int, method: str,
                   seconds: float) -> Forecast:
    """Put the fit and the causes together for ``world_size`` ranks at per-device ``batch``.

    Raises:
        ForecastError: when the device is smaller than what one process holds with no sample
            (the fit's fixed memory plus the per-process context).
    """
    single_extra = sum(c.mib for c in causes if c.single)
    if device_mib < fit.fixed + single_extra:
        raise ForecastError(
            f'{device_mib:.0f} MiB per device ({device_how}) is below the fixed memory of one '
            f'process, '
            f'{fit.fixed + single_extra:.0f} MiB (model, optimizer state and process context, '
            f'measured with no sample): give the real size of the device, e.g. --device-memory '
            f'24GiB, or use a smaller model')
    warnings: List[str] = []
    low, mid, high = fit.peak(batch)
    if not fit.linear:
        warnings.append(f'the measured peaks {[(b, round(p)) for b, p in fit.points]} are not '
                        f'close to a line (largest residual {fit.residual:.0f} MiB): the '
                        f'forecast is a range, {fit.slopes[0]:.1f}..{fit.slopes[1]:.1f} MiB '
                        f'per sample')
    extras = [
        sum(c.on_rank(r) for c in causes if world_size > 1 or c.single) for r in range(world_size)
    ]
    peaks = tuple(high + e for e in extras)
    ranges = None if fit.linear else tuple((low + e, high + e) for e in extras)
    single = high + single_extra
    max_single = largest_batch(fit, device_mib, reserve_mib, single_extra)
    max_ddp = largest_batch(fit, device_mib, reserve_mib, max(extras))
    for name, value in (('one process', max_single), (f'{world_size} processes', max_ddp)):
        if value is None:
            warnings.append(f'{name}: the measured peak does not grow with the batch, so no '
                            f'largest batch can be read from it')
        elif value < batch:
            warnings.append(f'{name}: the planned per-device batch {batch} does not fit '
                            f'{device_mib:.0f} MiB with {reserve_mib:.0f} MiB kept free; '
                            f'{value} does')
    return Forecast(device_mib=device_mib, device_how=device_how, world_size=world_size,
                    batch=batch, fit=fit, causes=tuple(causes), reserve_mib=reserve_mib,
                    predicted_peak_mib=peaks, predicted_range_mib=ranges,
                    predicted_single_mib=single, max_batch_single=max_single, max_batch_ddp=max_ddp,
                    method=method, seconds=seconds, warnings=tuple(warnings))


def render_forecast(forecast: Forecast) -> List[str]:
    """The forecast as readable lines: the fit, one line per cause, one per rank."""
    f, w = forecast, forecast.world_size
    est = lambda c: ' (estimate)' if c.estimate else ''  # noqa: E731
    lines = [
        f'memory: {f.device_mib:.0f} MiB per device ({f.device_how}); '
        f'{f.reserve_mib:.0f} MiB kept free, as the batch finder does',
        f'  fit: peak ≈ {f.fit.fixed:.0f} MiB + {f.fit.per_sample:.2f} MiB × batch '
        f'(points {", ".join(f"{b}: {p:.0f}" for b, p in f.fit.points)}; residual '
        f'{f.fit.residual:.1f} MiB{"" if f.fit.linear else ", NOT linear"})'
    ]
    for c in f.causes:
        scope = 'every process' if c.single else 'per rank under DDP'
        lines.append(f'  + {c.name}: {c.mib:.0f} MiB {scope}{est(c)}: {c.how}')
    lines.append(f'  {"rank":>4} {"batch":>5} {"predicted peak":>15}')
    for r, peak in enumerate(f.predicted_peak_mib):
        span = (f'  ({f.predicted_range_mib[r][0]:.0f}..{f.predicted_range_mib[r][1]:.0f})'
                if f.predicted_range_mib else '')
        lines.append(f'  {r:>4} {f.batch:>5} {peak:>11.0f} MiB{span}')
    lines.append(f'  largest per-device batch that fits: {f.max_batch_single} in one process, '
                 f'{f.max_batch_ddp} with {w} process(es)')
    lines.append(f'  measured by {f.method} in {f.seconds:.1f} s')
    lines += [f'  warning: {x}' for x in f.warnings]
    return lines
