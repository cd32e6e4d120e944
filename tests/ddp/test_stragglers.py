"""Per-rank speed, pure: the clock's medians, the straggler finding, the factor check, the plot."""
import os.path as osp

import pytest

from mmddp_ext.ddp.stragglers import (IterationClock, StragglerWatch, check_factor, check_patience,
                                      find_straggler, plot_speed)
from mmddp_ext.hooks.memory_hook import RankMemoryHook


def _rank(rank, it=0.20, data=0.01, fwd=0.06, host=None, iters=50):
    return dict(rank=rank, host=host or f'node{rank // 8}', iter=100, iter_time_s=it,
                data_time_s=data, forward_time_s=fwd, timed_iters=iters)


class FakeTime:

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_clock_splits_each_iteration_into_data_and_forward():
    t = FakeTime()
    clock = IterationClock(clock=t)
    clock.start()
    for data, fwd, rest in [(0.1, 0.2, 0.3), (0.5, 0.2, 0.3), (0.1, 0.4, 0.3)]:
        t.now += data
        clock.batch_ready()
        clock._forward_begins()
        t.now += fwd
        clock._forward_ends()
        t.now += rest
        clock.iteration_done()
    got = clock.take()
    assert got['timed_iters'] == 3
    assert got['iter_time_s'] == pytest.approx(0.8)  # of 0.6, 1.0, 0.8
    assert got['data_time_s'] == pytest.approx(0.1)
    assert got['forward_time_s'] == pytest.approx(0.2)
    assert clock.take() == dict(timed_iters=0, iter_time_s=None, data_time_s=None,
                                forward_time_s=None)


def test_clock_ignores_forward_outside_training_iterations():
    t = FakeTime()
    clock = IterationClock(clock=t)
    clock.start()
    clock._forward_begins()  # a validation forward, no batch_ready before it
    t.now += 5
    clock._forward_ends()
    t.now += 0.1
    clock.batch_ready()
    t.now += 0.2
    clock.iteration_done()
    assert clock.take()['forward_time_s'] == 0.0


def test_clock_times_a_real_module_forward():
    import time

    import torch

    class Slow(torch.nn.Module):

        def forward(self, x):
            time.sleep(0.05)
            return x

    clock, model = IterationClock(), Slow()
    clock.attach(model)
    clock.start()
    clock.batch_ready()
    model(torch.zeros(1))
    clock.iteration_done()
    clock.detach()
    model(torch.zeros(1))  # detached: not timed, and no error
    got = clock.take()
    assert got['forward_time_s'] >= 0.05 and got['iter_time_s'] >= got['forward_time_s']


def test_healthy_ranks_have_no_straggler():
    ranks = [_rank(r, data=0.01 + 0.001 * r, fwd=0.06 + 0.002 * (r % 3)) for r in range(16)]
    assert find_straggler(ranks, 1.5) is None


def test_a_slow_loader_is_named_as_data():
    ranks = [_rank(r) for r in range(8)]
    ranks[5] = _rank(5, data=0.30, it=0.45, host='gpu-node-7')
    found = find_straggler(ranks, 1.5)
    assert (found.rank, found.host, found.part) == (5, 'gpu-node-7', 'data')
    assert found.seconds == 0.30 and found.others == 0.01
    assert found.message.startswith('straggler: rank 5 (host gpu-node-7) is slower')
    assert 'data: 300 ms per iteration waiting for its batches' in found.message
    assert 'vs 10 ms on the other ranks (median over 50 iterations, above 1.5×)' in found.message
    assert 'num_workers' in found.message


def test_a_slow_forward_is_named_as_compute():
    ranks = [_rank(r) for r in range(4)]
    ranks[2] = _rank(2, fwd=0.30)
    found = find_straggler(ranks, 1.5)
    assert (found.rank, found.part) == (2, 'compute')
    assert 'forward pass (compute)' in found.message


def test_factor_bounds_the_finding():
    ranks = [_rank(0, data=0.05), _rank(1, data=0.10), _rank(2, data=0.05)]
    assert find_straggler(ranks, 1.5).rank == 1  # 2× the others
    assert find_straggler(ranks, 2.5) is None  # within 2.5×


def test_an_excess_that_costs_little_is_not_named():
    ranks = [_rank(0, data=0.001), _rank(1, data=0.010)]  # 10×, but 9 ms of 200
    assert find_straggler(ranks, 1.5) is None
    assert find_straggler(ranks, 1.5, min_share=0.01).rank == 1


def test_untimed_or_single_rank_gives_nothing():
    assert find_straggler([_rank(0)], 1.5) is None
    assert find_straggler([dict(_rank(0), iter_time_s=None), _rank(1, data=9)], 1.5) is None


@pytest.mark.parametrize('bad', [1, 0.5, -2, True, '1.5'])
def test_factor_is_checked(bad):
    with pytest.raises(ValueError, match=f'straggler_factor={bad!r} must be a number above 1'):
        check_factor(bad)
    with pytest.raises(ValueError, match='straggler_factor'):
        RankMemoryHook(straggler_factor=bad)


def _slow(rank, part='data'):
    ranks = [_rank(r) for r in range(4)]
    ranks[rank] = _rank(rank, data=0.30) if part == 'data' else _rank(rank, fwd=0.30)
    return ranks


def test_watch_names_a_rank_only_after_patience_samples_in_a_row():
    watch = StragglerWatch(1.5, 3)
    assert watch.see(_slow(1)) is None
    assert watch.see(_slow(1)) is None
    found = watch.see(_slow(1))
    assert (found.rank, found.part) == (1, 'data')
    assert found.message.endswith('(slow in 3 samples in a row)')
    assert watch.see(_slow(1)) is None  # named once


def test_watch_starts_again_when_a_sample_finds_another_rank_part_or_nobody():
    healthy = [_rank(r) for r in range(4)]
    for interruption in (healthy, _slow(2), _slow(1, 'compute')):
        watch = StragglerWatch(1.5, 2)
        assert watch.see(_slow(1)) is None
        assert watch.see(interruption) is None
        assert watch.see(_slow(1)) is None
        assert watch.see(_slow(1)).rank == 1


def test_watch_with_patience_1_names_at_the_first_sample():
    found = StragglerWatch(1.5, 1).see(_slow(3, 'compute'))
    assert (found.rank, found.part) == (3, 'compute')
    assert 'in a row' not in found.message


@pytest.mark.parametrize('bad', [0, -1, 2.0, True, '3'])
def test_patience_is_checked(bad):
    with pytest.raises(ValueError, match=f'straggler_patience={bad!r} must be a positive'):
        check_patience(bad)
    with pytest.raises(ValueError, match='straggler_patience'):
        RankMemoryHook(straggler_patience=bad)


def test_factor_none_switches_it_off():
    assert check_factor(None) is None and check_factor(2) == 2.0


def test_speed_plot(tmp_path):
    history = [[_rank(0, it=0.2), _rank(1, it=0.3, data=0.1)],
               [dict(_rank(0), iter=200), dict(_rank(1), iter=200)]]
    path = plot_speed(history, osp.join(str(tmp_path), 'speed.png'))
    assert path and osp.getsize(path) > 1000
    assert plot_speed([[dict(_rank(0), iter_time_s=None)]], str(tmp_path / 'none.png')) is None
