"""The finder's stored result: its key names what a measured batch depends on."""
from mmddp_ext.batch_finder.cache import cache_key


def test_cache_key_is_stable_and_changes_with_what_matters():
    facts = dict(model=dict(type='TopdownPoseEstimator', depth=18), budget_mib=1000, world=2)
    assert cache_key(facts) == cache_key(dict(reversed(list(facts.items()))))
    for key, value in [('budget_mib', 2000), ('world', 4), ('model', dict(depth=50))]:
        assert cache_key({**facts, key: value}) != cache_key(facts)
