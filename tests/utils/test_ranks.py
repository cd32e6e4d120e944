import pytest

from mmddp_ext.utils.ranks import group_ranks, rank_spans, ranks_text


@pytest.mark.parametrize('ranks, text', [
    ([], ''),
    ([4], '4'),
    ([3, 1, 2, 0], '0-3'),
    ([0, 1, 2, 3, 5, 7, 8], '0-3, 5, 7, 8'),
    ([0, 2, 4], '0, 2, 4'),
    ([1, 1, 2], '1, 2'),
    ([4, 5, 6], '4-6'),
])
def test_rank_spans(ranks, text):
    assert rank_spans(ranks) == text


def test_1024_ranks_but_one_fold_into_two_spans():
    ranks = [r for r in range(1024) if r != 733]
    assert rank_spans(ranks) == '0-732, 734-1023'
    assert ranks_text([733]) == 'rank 733'
    assert ranks_text(ranks) == 'ranks 0-732, 734-1023'


def test_group_ranks_largest_group_first():
    values = {r: 'all_reduce' for r in range(1024)}
    values[733] = 'broadcast'
    groups = group_ranks(values)
    assert [(v, len(rs)) for v, rs in groups] == [('all_reduce', 1023), ('broadcast', 1)]
    assert groups[1][1] == (733, )


def test_group_ranks_ties_by_lowest_rank():
    assert group_ranks({0: 'b', 1: 'a', 2: 'b', 3: 'a'}) == [('b', (0, 2)), ('a', (1, 3))]


def test_spans_beyond_most_are_counted():
    assert rank_spans([0, 2, 4, 6], most=2) == '0, 2 and 2 more'
    assert rank_spans(list(range(10)) + [20, 30], most=1) == '0-9 and 2 more'
    assert rank_spans([0, 2], most=2) == '0, 2'
    assert ranks_text(range(0, 1024, 2), most=3) == 'ranks 0, 2, 4 and 509 more'
