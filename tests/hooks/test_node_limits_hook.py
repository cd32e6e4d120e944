"""NodeLimitsHook: the warnings from every rank's view (pure), the view of a real toy run, and
the hook in MMEngine's toy runner. A real node with a 1 MiB /dev/shm:
tests/e2e/test_node_limits.py."""
from mmengine.testing import RunnerTestCase

from mmddp_ext.hooks import NodeLimitsHook
from mmddp_ext.hooks.node_limits_hook import node_warnings
from mmddp_ext.node.facts import node_facts
from mmddp_ext.node.measure import tensor_bytes

MIB, GIB = 2**20, 2**30


def _view(host, shm=64 * MIB, ram=64 * GIB, batch=4 * MIB, rss=GIB, workers=2):
    return dict(host=host, workers=workers, prefetch_factor=2, batch_bytes=batch, rss=rss,
                host_memory=ram, shm_size=shm)


def test_only_the_node_that_cannot_hold_its_batches_is_named_once():
    # n1: 2 ranks x 2 workers x 2 x 4 MiB = 32 MiB of 64 MiB; n2: 4 ranks -> 64 MiB... of 16
    views = [_view('n1')] * 2 + [_view('n2', shm=16 * MIB)] * 4
    lines = node_warnings(views)
    assert len(lines) == 1 and lines[0].startswith('node n2: shared memory needs 64.00 MiB of '
                                                   'its 16.00 MiB (4 rank(s) × 2 worker(s)')
    assert '--shm-size' in lines[0]


def test_host_memory_is_a_lower_bound_of_the_ranks_alone():
    lines = node_warnings([_view('n1', ram=3 * GIB, rss=2 * GIB)] * 2)
    assert len(lines) == 1 and lines[0].startswith('node n1: host memory needs at least 4.00 GiB')
    assert 'OOM killer' in lines[0]
    assert node_warnings([_view('n1', workers=0, shm=MIB, batch=GIB)]) == []  # no workers


class TestNodeLimitsHook(RunnerTestCase):

    def test_the_view_of_a_toy_run_and_no_warning_here(self):
        cfg = self.epoch_based_cfg
        cfg.custom_hooks = [dict(type='NodeLimitsHook')]
        runner = self.build_runner(cfg)
        hook = next(h for h in runner.hooks if isinstance(h, NodeLimitsHook))
        view = hook.view(runner)
        loader = runner.train_dataloader
        assert view['batch_bytes'] == tensor_bytes(loader.dataset[0]) * loader.batch_size > 0
        assert view['shm_size'] == node_facts().shm_size and view['workers'] == 0
        runner.train()
        assert hook.warnings == []  # one rank, no workers: nothing to warn of
