"""The pure core of the memory forecast: size parser, line fit, largest batch, per-rank sums."""
import math

import pytest

from mmddp_ext.errors import UserError
from mmddp_ext.memory.forecast import (NOISE_MIB, Cause, ForecastError, build_forecast, fit_line,
                                       largest_batch, parse_size, render_forecast, trial_batches)

CONTRACT = ('device_mib', 'fixed_mib', 'per_sample_mib', 'ddp_extra_mib', 'predicted_peak_mib',
            'max_batch_single', 'max_batch_ddp', 'method', 'seconds')


@pytest.mark.parametrize('text, mib', [
    ('24GiB', 24576.0),
    ('23.64GiB', 23.64 * 1024),
    ('16000MiB', 16000.0),
    ('512M', 512.0),
    ('1.5g', 1536.0),
    ('2048', 2048.0),
    ('1TiB', 2.0**20),
    ('24GB', 24e9 / 2**20),
    (' 8 GiB ', 8192.0),
    ('1048576KiB', 1024.0),
])
def test_parse_size_reads_units(text, mib):
    assert parse_size(text) == pytest.approx(mib)


@pytest.mark.parametrize('text, says', [
    ('0', 'must be a positive size'),
    ('0GiB', 'must be a positive size'),
    ('-8GiB', 'must be a positive size'),
    ('abc', 'is not a memory size'),
    ('24 parsecs', 'is not a memory size'),
    ('', 'is not a memory size'),
    ('GiB', 'is not a memory size'),
])
def test_parse_size_rejects_with_the_value_and_an_example(text, says):
    with pytest.raises(ForecastError) as info:
        parse_size(text)
    message = str(info.value)
    assert f'--device-memory={text!r}' in message and says in message
    assert 'e.g. --device-memory 24GiB' in message and '\n' not in message
    assert isinstance(info.value, UserError)  # the CLI prints it as one line, exit 1


@pytest.mark.parametrize('batch, expected', [
    (1, [1, 2]),
    (2, [1, 2]),
    (3, [1, 3]),
    (8, [2, 4, 8]),
    (32, [8, 16, 32]),
    (50, [12, 25, 50]),
])
def test_trial_batches(batch, expected):
    assert trial_batches(batch) == expected


@pytest.mark.parametrize('fixed', [0.0, 350.0, 12000.0])
@pytest.mark.parametrize('slope', [0.5, 2.46, 180.0])
@pytest.mark.parametrize('batches', [(1, 2), (8, 16, 32), (3, 5, 11)])
def test_fit_recovers_a_line(fixed, slope, batches):
    fit = fit_line([(b, fixed + slope * b) for b in batches])
    assert fit.fixed == pytest.approx(fixed, abs=1e-6)
    assert fit.per_sample == pytest.approx(slope)
    assert fit.linear and fit.residual == pytest.approx(0, abs=1e-6)
    assert fit.peak(64) == pytest.approx((fixed + 64 * slope, ) * 3)


@pytest.mark.parametrize('noise', [(0.0, 3.0, -3.0), (2.5, -2.5, 1.0), (-5.0, 7.0, -2.0)])
def test_noise_within_the_tolerance_is_still_a_line(noise):
    fit = fit_line([(b, 500 + 2 * b + n) for b, n in zip((8, 16, 32), noise)])
    assert fit.linear and fit.residual <= NOISE_MIB
    assert fit.per_sample == pytest.approx(2, abs=0.5)


def test_a_curve_gives_a_range_and_a_warning():
    points = [(8, 1000.0), (16, 1020.0), (32, 1400.0)]  # flat, then steep
    fit = fit_line(points)
    assert not fit.linear
    assert fit.slopes == pytest.approx((2.5, 23.75))
    low, mid, high = fit.peak(64)
    assert low < mid < high
    assert high == pytest.approx(1400 + 23.75 * 32)
    forecast = build_forecast(fit, [], 4096, 'test', 409.6, 1, 32, 'synthetic', 0.0)
    assert forecast.predicted_range_mib is not None
    assert any('not close to a line' in w for w in forecast.warnings)
    # the largest batch is read from the pessimistic end: 1400 + 23.75 × (b - 32) <= 3686.4
    assert forecast.max_batch_single == math.floor((4096 - 409.6 - 1400) / 23.75 + 32)


@pytest.mark.parametrize('points', [[(4, 1.0)], [(4, 1.0), (4, 2.0)], [(0, 1.0), (2, 3.0)]])
def test_fit_needs_two_batches(points):
    with pytest.raises(ValueError, match='two or more different batches'):
        fit_line(points)


@pytest.mark.parametrize(
    'fixed, slope, device, reserve, extra, expected',
    [
        (1000, 50, 4096, 409.6, 300, 47),  # the docstring's example
        (1000, 50, 4096, 409.6, 0, 53),
        (1000, 50, 1100, 0, 0, 2),
        (1000, 50, 1049, 0, 0, 0),  # not even one sample
        (1000, 50, 900, 0, 0, 0),  # the device is below the fixed memory
        (100, 10, 200, 0, 0, 10),  # exactly full is still a fit
    ])
def test_largest_batch(fixed, slope, device, reserve, extra, expected):
    fit = fit_line([(1, fixed + slope), (2, fixed + 2 * slope)])
    assert largest_batch(fit, device, reserve, extra) == expected


def test_largest_batch_without_growth_is_unknown():
    assert largest_batch(fit_line([(1, 900.0), (4, 900.0)]), 4096, 409.6) is None
    assert largest_batch(fit_line([(1, 900.0), (4, 899.0)]), 4096, 409.6) is None


def _causes(context=600.0, bucket=0.0, comm=25.0, stray=(0.0, 0.0)):
    return [
        Cause('process_context', context, False, 'measured', single=True),
        Cause('gradient_bucket_copy', bucket, False, 'counted'),
        Cause('communication_buffers', comm, True, 'one bucket'),
        Cause('stray_contexts', max(stray), False, 'nvml', per_rank=tuple(stray))
    ]


@pytest.mark.parametrize('world', [1, 2, 4, 8, 16])
def test_per_rank_peak_is_fit_plus_causes(world):
    fit = fit_line([(8, 544.0), (16, 563.0), (32, 603.0)])
    stray = tuple(float(r) for r in range(world))
    forecast = build_forecast(fit, _causes(stray=stray), 24000 / world, 'RAM', 160, world, 16,
                              'synthetic', 1.0)
    one = fit.fixed + fit.per_sample * 16 + 600
    expected = [one] if world == 1 else [one + 25 + r for r in range(world)]
    assert forecast.predicted_peak_mib == pytest.approx(expected)
    assert forecast.predicted_single_mib == pytest.approx(one)
    out = forecast.to_dict()
    assert set(CONTRACT) <= set(out) and len(out['predicted_peak_mib']) == world
    assert out['ddp_extra_mib']['communication_buffers'] == dict(value=25.0, estimate=True,
                                                                 how='one bucket', single=False)
    assert out['ddp_extra_mib']['stray_contexts']['per_rank'] == list(stray)
    assert any(line.startswith('  largest per-device batch') for line in render_forecast(forecast))


def test_issue_13_shape_ddp_fits_fewer_samples_than_one_process():
    """A 24 GiB card (23.64 GiB usable), a model that fits batch 50 alone; under DDP a gradient
    bucket copy, NCCL buffers and rank 1's 1.89 GiB stray context on GPU 0 take the rest."""
    fit = fit_line([(12, 4000 + 12 * 340), (25, 4000 + 25 * 340), (50, 4000 + 50 * 340)])
    causes = _causes(context=500.0, bucket=180.0, comm=25.0, stray=(1.89 * 1024, 0.0))
    device = 23.64 * 1024
    forecast = build_forecast(fit, causes, device, '--device-memory 23.64GiB', 0.1 * device, 2, 50,
                              'synthetic', 1.0)
    assert forecast.max_batch_single >= 50 > forecast.max_batch_ddp
    assert forecast.predicted_peak_mib[0] - forecast.predicted_peak_mib[1] == pytest.approx(1.89 *
                                                                                            1024)
    assert any('2 processes: the planned per-device batch 50 does not fit' in w
               for w in forecast.warnings)


def test_a_device_below_the_fixed_memory_is_one_clear_error():
    fit = fit_line([(1, 900.0), (2, 910.0)])
    with pytest.raises(
            ForecastError, match=r'^1000 MiB per device \(--device-memory 1000MiB\) '
            r'is below the fixed memory of one process, 1490 MiB .* e\.g\. '
            r'--device-memory 24GiB'):
        build_forecast(fit, _causes(context=600.0), 1000, '--device-memory 1000MiB', 100, 2, 2,
                       'synthetic', 0.0)
