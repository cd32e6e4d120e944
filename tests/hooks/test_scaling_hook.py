"""ScalingHook in-process, on MMEngine's toy runner built by DDPRunner (12 samples, batch 3,
SGD lr 0.1): the plan is logged and stored in checkpoints, a resume with another split of the
same global batch continues at the same number of samples seen, and another global batch is
refused with the fix."""
import copy
import os.path as osp

import pytest
import torch
from mmengine.testing import RunnerTestCase

from mmddp_ext.hooks.scaling_hook import META_KEY
from mmddp_ext.runner.ddp_runner import DDPRunner
from mmddp_ext.scaling.resume import ResumeMismatch


class TestScalingHook(RunnerTestCase):

    def _cfg(self, work_dir, **scaling):
        cfg = copy.deepcopy(self.iter_based_cfg)
        cfg.work_dir = work_dir
        cfg.train_cfg = dict(by_epoch=False, max_iters=8)
        cfg.default_hooks.checkpoint = dict(type='CheckpointHook', interval=4, by_epoch=False)
        cfg.param_scheduler = [dict(type='MultiStepLR', by_epoch=False, milestones=[6])]
        cfg.scaling = dict(global_batch_size=6, **scaling)
        cfg.experiment_name = f'{self.experiment_name}_{len(scaling)}'
        return cfg

    def _train(self, cfg, until=None):
        if until is not None:
            cfg.train_cfg.max_iters = until
        runner = DDPRunner.from_cfg(cfg)
        with self.assertLogs(runner.logger, level='INFO') as logs:
            runner.train()
        return runner, '\n'.join(logs.output)

    def test_plan_logged_and_stored_in_checkpoints(self):
        runner, out = self._train(self._cfg(self.temp_dir.name))
        plan = runner.scaling_plan
        self.assertEqual((plan.per_device_batch_size, plan.accumulative_counts), (3, 2))
        self.assertIn('mmddp_ext scaling plan', out)
        # global 6 on one process within the written batch of 3: 3 × accumulation 2; the toy
        # config names no base batch
        self.assertIn('per-GPU batch 3 × 1 GPU × accumulation 2 = global 6', out)
        ckpt = torch.load(osp.join(self.temp_dir.name, 'iter_4.pth'), weights_only=False)
        saved = ckpt['meta'][META_KEY]
        self.assertEqual((saved['world_size'], saved['per_device_batch_size'],
                          saved['accumulative_counts'], saved['global_batch_size']), (1, 3, 2, 6))
        # the LR of the optimizer as it was stepped, and the samples per iteration
        self.assertEqual(
            saved['lrs'],
            [pytest.approx(g['initial_lr']) for g in ckpt['optimizer']['param_groups']])
        self.assertEqual(saved['samples_per_iter'], 3)

    def test_resume_with_another_split_keeps_the_samples_seen(self):
        work = self.temp_dir.name
        self._train(self._cfg(work), until=4)  # 3 per device x accumulation 2
        saved = torch.load(osp.join(work, 'iter_4.pth'), weights_only=False)
        cfg = self._cfg(work, max_batch_per_device=1)  # 1 per device x accumulation 6
        cfg.resume = True
        runner = DDPRunner.from_cfg(cfg)
        plan = runner.scaling_plan
        factor = saved['meta'][META_KEY]['samples_per_iter'] / plan.samples_per_iter
        self.assertEqual(factor, 3)
        with self.assertLogs(runner.logger, level='INFO') as logs:
            runner.train()
        self.assertIn('iteration 4 → 12 (× 3: same samples seen)', '\n'.join(logs.output))
        self.assertEqual(runner.iter, 8 * 3)  # max_iters scaled by the plan too

    def test_resume_with_another_global_batch_is_refused_with_the_fix(self):
        work = self.temp_dir.name
        self._train(self._cfg(work), until=4)
        cfg = self._cfg(work)
        cfg.scaling.global_batch_size = 3
        cfg.resume = True
        runner = DDPRunner.from_cfg(cfg)
        with self.assertRaisesRegex(ResumeMismatch, 'scaling.global_batch_size=6'):
            runner.train()
