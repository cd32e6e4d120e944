"""NodeLimitsHook: the warnings from every rank's view (pure), the view of a real toy run, and
the hook in MMEngine's toy runner. A real node with a 1 MiB /dev/shm:
tests/e2e/test_node_limits.py."""
import copy
import random

import numpy as np
import torch
from mmengine.registry import DATASETS, MODELS
from mmengine.testing import RunnerTestCase
from mmengine.testing.runner_test_case import ToyDataset, ToyModel

from mmddp_ext.hooks import NodeLimitsHook
from mmddp_ext.hooks.node_limits_hook import node_warnings
from mmddp_ext.node.facts import node_facts
from mmddp_ext.node.limits import NodeFacts
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


@DATASETS.register_module(force=True)
class RandomDrawDataset(ToyDataset):
    """The toy dataset, drawing from Python's, NumPy's and torch's generators per sample, as
    random augmentations do."""

    def __getitem__(self, index):
        random.random(), np.random.rand(), torch.rand(1)
        return super().__getitem__(index)


def _states():
    return random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state().tolist()


@MODELS.register_module(force=True)
class ToyBNModel(ToyModel):
    """The toy model with a BatchNorm that trains, or that ``train()`` freezes (norm_eval)."""

    def __init__(self, frozen: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.bn = torch.nn.BatchNorm1d(2)
        self.frozen = frozen

    def train(self, mode: bool = True):
        super().train(mode)
        if self.frozen:
            self.bn.eval()
        return self

    def forward(self, inputs, data_samples=None, mode='tensor'):
        inputs = torch.stack(inputs) if isinstance(inputs, list) else inputs
        return super().forward(self.bn(inputs), data_samples, mode)


class TestNodeLimitsHook(RunnerTestCase):

    def test_a_batchnorm_that_trains_on_few_samples_is_warned_once_frozen_ones_not(self):
        for frozen, expected in ((False, 'BatchNorm: 1 layer(s) that train normalise over 2 '
                                  'sample(s) each step, below 8'), (True, None)):
            cfg = copy.deepcopy(self.epoch_based_cfg)
            cfg.experiment_name += f'_bn{frozen}'
            cfg.model = dict(type='ToyBNModel', frozen=frozen)
            cfg.custom_hooks = [dict(type='NodeLimitsHook')]
            cfg.train_dataloader.batch_size = 2
            runner = self.build_runner(cfg)
            runner.train()
            hook = next(h for h in runner.hooks if isinstance(h, NodeLimitsHook))
            if expected is None:
                assert hook.bn_warning is None
            else:
                assert hook.bn_warning.startswith(expected) and "sync_bn='torch'" in hook.bn_warning

    def test_the_view_loads_a_sample_only_where_shm_may_be_short(self):
        small = NodeFacts(host_memory=64 * GIB, shm_size=64 * MIB)  # Docker's default
        cfg = self.epoch_based_cfg
        cfg.custom_hooks = [dict(type='NodeLimitsHook')]
        cfg.train_dataloader.dataset.type = 'RandomDrawDataset'
        runner = self.build_runner(cfg)
        hook = next(h for h in runner.hooks if isinstance(h, NodeLimitsHook))
        assert hook.view(runner, small)['batch_bytes'] == 0  # no workers: nothing to size
        cfg = copy.deepcopy(self.epoch_based_cfg)
        cfg.experiment_name += '_workers'
        cfg.custom_hooks = [dict(type='NodeLimitsHook')]
        cfg.train_dataloader.update(num_workers=1, dataset=dict(type='RandomDrawDataset'))
        runner = self.build_runner(cfg)
        hook = next(h for h in runner.hooks if isinstance(h, NodeLimitsHook))
        large = NodeFacts(host_memory=64 * GIB, shm_size=32 * GIB)  # a host's: half the RAM
        assert hook.view(runner, large)['batch_bytes'] == 0
        before = _states()
        view = hook.view(runner, small)
        assert _states() == before  # training draws what it would have drawn
        loader = runner.train_dataloader
        assert view['batch_bytes'] == tensor_bytes(loader.dataset[0]) * loader.batch_size > 0
        assert view['shm_size'] == 64 * MIB and view['workers'] == 1
        assert hook.view(runner)['shm_size'] == node_facts().shm_size  # read here by default

    def test_one_rank_on_this_machine_trains_without_a_warning(self):
        cfg = self.epoch_based_cfg
        cfg.custom_hooks = [dict(type='NodeLimitsHook')]
        runner = self.build_runner(cfg)
        runner.train()
        hook = next(h for h in runner.hooks if isinstance(h, NodeLimitsHook))
        assert hook.warnings == []
