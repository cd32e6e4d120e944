"""The batch search, its cache key and micro-batch splitting (pure, table-tested); the
agreement across ranks and the search driven through it, in 2 real gloo processes."""
import json
import math
import os.path as osp

import pytest

from mmddp_ext.batch_finder.search import SearchResult, Trial, max_trials, search_max_batch

from conftest import PYTHON, check_ok, once, run

UPPERS = [1, 2, 3, 7, 16, 17, 64, 100, 512]


@pytest.mark.parametrize('upper', UPPERS)
def test_finds_the_largest_fitting_batch_within_the_trial_bound(upper):
    for limit in range(0, upper + 1):
        tried = []
        result = search_max_batch(upper, lambda b: tried.append(b) or b <= limit)
        assert result.max_batch == limit
        assert tried[0] == upper  # the common case costs one trial
        # the bound docs/scaling.md promises: one trial at the top, then a bisection
        assert len(tried) <= max_trials(upper) == math.ceil(math.log2(upper)) + 1
        assert [t.batch for t in result.trials] == tried
        assert [t.fits for t in result.trials] == [b <= limit for b in tried]


def test_every_rank_follows_the_same_path_given_the_agreed_answers():
    # two ranks with different limits; fits() returns the MIN, as the probe's gather does
    limits = {0: 40, 1: 23}
    paths = {}
    for rank in limits:
        seen = []
        res = search_max_batch(64, lambda b: seen.append(b) or all(b <= v for v in limits.values()))
        paths[rank] = (seen, res.max_batch)
    assert paths[0] == paths[1] and paths[0][1] == 23


def test_progress_is_reported_after_every_trial():
    calls = []
    ticks = iter(range(100))
    result = search_max_batch(8, lambda b: b <= 5, lambda n, t: calls.append((n, t)),
                              clock=lambda: float(next(ticks)))
    assert [n for n, _ in calls] == list(range(1, len(result.trials) + 1))
    assert all(t.seconds == 1.0 for _, t in calls) and result.seconds == len(calls)


@pytest.mark.parametrize('bad', [0, -1, 2.0, '8', True, None])
def test_bad_upper_is_named(bad):
    with pytest.raises(ValueError, match=r'upper=.*positive int'):
        search_max_batch(bad, lambda b: True)


def test_result_round_trips_through_json_dict():
    result = SearchResult(
        12, 32,
        (Trial(32, False, 1.5), Trial(16, False, 0.5), Trial(8, True, 0.25), Trial(12, True, 0.3)))
    assert SearchResult.from_dict(result.to_dict()) == result


# per case: (limit of rank 0, limit of rank 1), the largest batch that fits on that rank alone
RANK_LIMITS = {
    'rank1_lower': [40, 23],
    'rank0_lower': [23, 40],
    'equal': [17, 17],
    'rank1_fits_nothing': [64, 0],
    'both_fit_upper': [64, 100]
}
UPPER = 64


@pytest.fixture(scope='module')
def two_ranks(tmp_path_factory):
    """``tests/helpers/agreement_ranks.py`` under torchrun, 2 gloo processes: ``{rank: record}``,
    once for the session."""

    def build(out: str) -> None:
        check_ok(
            run([
                PYTHON, '-m', 'torch.distributed.run', '--nproc_per_node', '2', '--standalone',
                'tests/helpers/agreement_ranks.py', out,
                str(UPPER),
                json.dumps(RANK_LIMITS)
            ], timeout=300))

    out = once(tmp_path_factory, 'agreement_ranks', build)
    return {r: json.load(open(osp.join(out, f'rank{r}.json'))) for r in (0, 1)}


@pytest.mark.slow
def test_ranks_out_of_memory_agrees_across_real_processes(two_ranks):
    for rank, rec in two_ranks.items():
        assert (rec['rank'], rec['world']) == (rank, 2)
        # rank 1 says not-ok, rank 0 ok: both learn [1]; and the other ways round
        assert rec['agree'] == dict(rank1_fails=[1], rank0_fails=[0], all_fit=[],
                                    all_fail=[0, 1]), rank


@pytest.mark.slow
@pytest.mark.parametrize('case', sorted(RANK_LIMITS))
def test_search_through_the_agreement_takes_the_lowest_limit(two_ranks, case):
    lowest = min(min(RANK_LIMITS[case]), UPPER)
    results = [two_ranks[r]['search'][case] for r in (0, 1)]
    assert results[0]['max_batch'] == results[1]['max_batch'] == lowest
    assert results[0]['trials'] == results[1]['trials']  # the same path on both
    trials = results[0]['trials']
    assert trials[0][0] == UPPER and len(trials) <= 1 + math.ceil(math.log2(UPPER))
    for batch, agreed in trials:
        assert agreed == (batch <= lowest)
    # each rank's own answers: the agreed one is "every rank fitted"
    for rank in (0, 1):
        assert [b for b, _ in results[rank]['local']] == [b for b, _ in trials]
        assert all(ok == (b <= RANK_LIMITS[case][rank]) for b, ok in results[rank]['local'])
    answers = list(zip(*[[ok for _, ok in r['local']] for r in results]))
    assert [all(a) for a in answers] == [agreed for _, agreed in trials]
    if len(set(RANK_LIMITS[case])) > 1 and lowest < UPPER:
        assert any(len(set(a)) > 1 for a in answers), 'the ranks never disagreed'
