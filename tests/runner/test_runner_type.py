"""``runner_type`` from entry points that call ``Runner.from_cfg`` (MMPose's tools/train.py, a
user's script), and SyncBN on CPUs. In-process, on MMEngine's toy runner."""
import copy
import logging
import os
from unittest import mock

import pytest
import torch
from mmengine.registry import MODELS, RUNNERS
from mmengine.runner import Runner
from mmengine.testing import RunnerTestCase
from mmengine.testing.runner_test_case import ToyModel

import mmddp_ext  # noqa: F401  (what custom_imports does)
from mmddp_ext.ddp.wrapper import batchnorm_for_cpu, sync_bn_layers
from mmddp_ext.runner.ddp_runner import DDPRunner
from mmddp_launch.rendezvous import find_free_port


class TestRunnerType(RunnerTestCase):

    def _cfg(self, runner_type=None):
        cfg = copy.deepcopy(self.epoch_based_cfg)
        cfg.experiment_name = self.experiment_name
        if runner_type is not None:
            cfg.runner_type = runner_type
        return cfg

    def test_runner_from_cfg_builds_the_configs_runner_type(self):
        runner = Runner.from_cfg(self._cfg('DDPRunner'))
        self.assertIs(type(runner), DDPRunner)
        self.assertIsNotNone(runner.scaling_plan)  # the plan was applied
        hooks = {type(h).__name__ for h in runner.hooks}
        self.assertTrue({'ScalingHook', 'RankMemoryHook'} <= hooks)

    def test_any_registered_subclass_is_honoured(self):

        @RUNNERS.register_module(force=True)
        class CountingRunner(Runner):
            built = 0

            @classmethod
            def from_cfg(cls, cfg):
                cls.built += 1
                return super().from_cfg(cfg)

        runner = Runner.from_cfg(self._cfg('CountingRunner'))
        self.assertIs(type(runner), CountingRunner)
        self.assertEqual(CountingRunner.built, 1)

    def test_without_runner_type_or_with_runner_it_is_the_stock_runner(self):
        self.assertIs(type(Runner.from_cfg(self._cfg())), Runner)
        self.assertIs(type(Runner.from_cfg(self._cfg('Runner'))), Runner)
        self.assertIs(type(RUNNERS.build(self._cfg('DDPRunner'))), DDPRunner)

    @pytest.mark.slow
    def test_a_stock_runner_built_directly_says_so(self):
        cfg = self._cfg('DDPRunner')
        args = {k: v for k, v in cfg.items() if k != 'runner_type'}
        runner = Runner(**args, cfg=cfg)
        self.assertIs(type(runner), Runner)
        log_file = next(
            h.baseFilename for h in runner.logger.handlers if isinstance(h, logging.FileHandler))
        for handler in runner.logger.handlers:
            handler.flush()
        with open(log_file) as f:
            text = f.read()
        self.assertEqual(
            text.count("asks for runner_type='DDPRunner', but a stock mmengine "
                       'Runner was built'), 1)


@MODELS.register_module(force=True)
class ToySyncBNModel(ToyModel):

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.norm = torch.nn.SyncBatchNorm(1)


def test_sync_bn_becomes_batchnorm_for_cpus():
    model = ToySyncBNModel()
    assert sync_bn_layers(model) == 1
    converted = batchnorm_for_cpu(model)
    assert sync_bn_layers(converted) == 0
    assert isinstance(converted.norm, torch.nn.modules.batchnorm._BatchNorm)
    plain = ToyModel()
    assert batchnorm_for_cpu(plain) is plain  # nothing to convert: untouched


class TestSyncBNOnCPU(RunnerTestCase):

    def test_distributed_cpu_run_trains_a_syncbn_model(self):
        """One gloo process under a launcher: DDP would refuse SyncBN on a CPU module. The
        launcher's variables are set for this test only (the later tests start processes that
        inherit this one's environment), on a free port."""
        launcher_env = dict(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(find_free_port()), RANK='0',
                            WORLD_SIZE='1', LOCAL_RANK='0')
        before = {key: os.environ.get(key) for key in launcher_env}
        with mock.patch.dict(os.environ, launcher_env):
            self._train_syncbn_model()
        self.assertEqual({key: os.environ.get(key) for key in launcher_env}, before)

    def _train_syncbn_model(self):
        cfg = copy.deepcopy(self.epoch_based_cfg)
        cfg.experiment_name = self.experiment_name
        cfg.model = dict(type='ToySyncBNModel')
        cfg.launcher = 'pytorch'
        cfg.sync_bn = 'torch'
        cfg.find_unused_parameters = True  # the toy model's norm layer is not in its loss
        cfg.runner_type = 'DDPRunner'
        cfg.train_cfg.max_epochs = 1
        runner = Runner.from_cfg(cfg)
        try:
            runner.train()
            self.assertEqual(sync_bn_layers(runner.model), 0)
            self.assertIsNone(runner.cfg.get('sync_bn'))
        finally:
            torch.distributed.destroy_process_group()
