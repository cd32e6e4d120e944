"""DDPRunner as a drop-in for MMEngine's Runner: configs with nothing to train pass through
unplanned, and a reference batch no world size reproduces keeps MMEngine's per-device batch.

In-process, on MMEngine's toy runner (12 samples, batch 3, SGD lr 0.1)."""
import copy

from mmengine.runner import Runner
from mmengine.testing import RunnerTestCase

from mmddp_ext.errors import ScalingError
from mmddp_ext.runner.ddp_runner import DDPRunner

NO_PLAN = 'no scaling plan'
TRAINING_PARTS = ('train_dataloader', 'train_cfg', 'optim_wrapper', 'param_scheduler',
                  'auto_scale_lr')


class TestNothingToTrain(RunnerTestCase):
    """A config without train_dataloader / train_cfg / optim_wrapper: built to validate or
    test only (MMEngine's test_val / test_test, MMPose's tools/test.py)."""

    def _eval_cfg(self, **extra):
        cfg = copy.deepcopy(self.epoch_based_cfg)
        for key in TRAINING_PARTS:
            cfg.pop(key, None)
        # what a config inheriting configs/_base_/ddp_runtime.py carries
        cfg.runner_type = 'DDPRunner'
        cfg.scaling = dict(global_batch_size=None, max_batch_per_device=None, base_batch_size=None,
                           lr_rule='linear', schedule='keep_samples')
        cfg.update(extra)
        cfg.experiment_name = self.experiment_name
        return cfg

    def test_builds_validates_and_tests_unplanned(self):
        runner = DDPRunner.from_cfg(self._eval_cfg())
        self.assertIsNone(runner.scaling_plan)
        self.assertEqual(tuple(runner.scaling_changes), ())
        hooks = [type(h).__name__ for h in runner.hooks]
        self.assertIn('ScalingHook', hooks)
        with self.assertLogs(runner.logger, level='INFO') as logs:
            metrics = runner.val()
        self.assertEqual(metrics, dict(acc=1))
        self.assertFalse([line for line in logs.output if NO_PLAN in line])
        self.assertEqual(runner.test(), dict(acc=1))

    def test_scaling_block_does_not_apply(self):
        # an unknown key is rejected whenever the block is read: here it is not
        cfg = self._eval_cfg(scaling=dict(global_batch=16))
        runner = DDPRunner.from_cfg(cfg)
        self.assertEqual(runner.val(), dict(acc=1))
        cfg = copy.deepcopy(self.epoch_based_cfg)
        cfg.scaling = dict(global_batch=16)
        cfg.experiment_name = self.experiment_name
        runner = DDPRunner.from_cfg(cfg)  # the same block with training parts is read:
        self.assertIsNone(runner.scaling_plan)  # refused, so no plan, and evaluation runs
        self.assertEqual(runner.test(), dict(acc=1))
        with self.assertRaisesRegex(ScalingError, 'global_batch'):
            runner.train()  # training raises the refusal before anything trains

    def test_partial_training_parts_fail_as_in_mmengine(self):
        cfg = self._eval_cfg(train_dataloader=copy.deepcopy(self.epoch_based_cfg.train_dataloader))
        with self.assertRaisesRegex(ValueError, 'should be either all None or not None'):
            DDPRunner.from_cfg(cfg)

    def test_stock_runner_that_trains_still_gets_the_warning(self):
        # the warning is kept where it means something: a runner with a train loop, no plan
        cfg = copy.deepcopy(self.epoch_based_cfg)
        cfg.custom_hooks = [dict(type='ScalingHook')]
        cfg.train_cfg = dict(by_epoch=True, max_epochs=1)
        cfg.experiment_name = self.experiment_name
        runner = Runner.from_cfg(cfg)
        with self.assertLogs(runner.logger, level='WARNING') as logs:
            runner.train()
        self.assertTrue([line for line in logs.output if NO_PLAN in line])


class TestReferenceBatchNoWorldSizeReproduces(RunnerTestCase):
    """MMEngine's test config: batch_size=3 on 1 process, auto_scale_lr base 16 (disabled).
    16 is no whole number of 3-sample batches."""

    def _cfg(self, base, **scaling):
        cfg = copy.deepcopy(self.epoch_based_cfg)
        cfg.auto_scale_lr = dict(base_batch_size=base, enable=False)
        if scaling:
            cfg.scaling = scaling
        cfg.train_cfg = dict(by_epoch=True, max_epochs=1)
        cfg.experiment_name = self.experiment_name
        return cfg

    def test_keeps_per_device_semantics_with_one_warning(self):
        runner = DDPRunner.from_cfg(self._cfg(16))
        plan = runner.scaling_plan
        self.assertEqual(plan.mode, 'per_device')
        self.assertEqual((plan.per_device_batch_size, plan.accumulative_counts), (3, 1))
        self.assertEqual(plan.lr_scale, 1.0)
        self.assertEqual(len(plan.warnings), 1)
        self.assertIn('auto_scale_lr.base_batch_size=16', plan.warnings[0])
        self.assertIn('multiple of 3 (e.g. 15 or 18)', plan.warnings[0])
        self.assertEqual(tuple(runner.scaling_changes), ())
        with self.assertLogs(runner.logger, level='INFO') as logs:
            runner.train()
        self.assertTrue([line for line in logs.output if plan.warnings[0] in line])
        # as MMEngine's Runner runs it: 12 samples in 4 batches of 3, one step each, LR 0.1
        self.assertEqual(runner.iter, 4)
        self.assertEqual(runner.train_dataloader.batch_size, 3)
        self.assertEqual(runner.optim_wrapper._accumulative_counts, 1)
        self.assertEqual(runner.optim_wrapper.get_lr()['lr'], [0.1])

    def test_a_reproducible_reference_is_still_a_recipe(self):
        # 15 = 5 batches of 3: on 1 process, batch 3 × accumulation 5 reproduces it
        plan = DDPRunner.from_cfg(self._cfg(15)).scaling_plan
        self.assertEqual(plan.mode, 'recipe')
        self.assertEqual((plan.per_device_batch_size, plan.accumulative_counts), (3, 5))

    def test_explicit_global_batch_means_what_it_says(self):
        runner = DDPRunner.from_cfg(self._cfg(16, global_batch_size=16))
        plan = runner.scaling_plan
        self.assertEqual(plan.mode, 'recipe')
        self.assertEqual(plan.global_batch_size, 16)
        self.assertEqual((plan.per_device_batch_size, plan.accumulative_counts), (2, 8))
        self.assertFalse([w for w in plan.warnings if 'auto_scale_lr.base_batch_size' in w])
