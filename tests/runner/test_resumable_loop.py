"""ResumableEpochLoop and ResumableSampler, in-process on MMEngine's toy runner (12 samples,
batch 3: 4 iterations per epoch): a resume from a checkpoint saved in the middle of an epoch
trains the rest of that epoch, with the batches the interrupted run would have had."""
import copy
import os.path as osp

from mmengine.hooks import Hook
from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop, Runner
from mmengine.testing import RunnerTestCase

from mmddp_ext.runner.resumable_loop import ResumableEpochLoop, ResumableSampler, resumable_loop_cfg


class _Record(Hook):
    """(iteration from 1, batch index, a fingerprint of each sample) per trained iteration."""

    def __init__(self) -> None:
        self.seen = []

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self.seen.append((runner.iter + 1, batch_idx,
                          tuple(round(float(x.sum()), 5) for x in data_batch['inputs'])))


class TestResumableLoop(RunnerTestCase):

    def _cfg(self, work_dir: str, seed: int, **extra):
        cfg = copy.deepcopy(self.epoch_based_cfg)
        cfg.train_cfg = dict(type='ResumableEpochLoop', max_epochs=2, val_interval=2)
        cfg.default_hooks = dict(checkpoint=dict(type='CheckpointHook', interval=1, by_epoch=False))
        cfg.randomness = dict(seed=seed)
        cfg.work_dir = work_dir
        cfg.experiment_name = f'{self.experiment_name}_{seed}'
        cfg.update(extra)
        return cfg

    def _train(self, cfg) -> list:
        runner = Runner.from_cfg(cfg)
        record = _Record()
        runner.register_hook(record)
        runner.train()
        self.assertIsInstance(runner.train_loop, ResumableEpochLoop)
        self.assertIsInstance(runner.train_dataloader.sampler, ResumableSampler)
        return record.seen

    def test_resume_mid_epoch_continues_at_the_next_batch(self):
        first = osp.join(self.temp_dir.name, 'first')
        reference = self._train(self._cfg(first, seed=0))
        self.assertEqual([it for it, _, _ in reference], list(range(1, 9)))
        # resumed from after batch 2 of epoch 2, by a run with another seed of its own
        resumed = self._train(
            self._cfg(
                osp.join(self.temp_dir.name, 'second'), seed=123, resume=True,
                load_from=osp.join(first, 'iter_6.pth')))
        self.assertEqual(resumed, reference[6:])  # iterations 7, 8: batches 2, 3 of epoch 2

    def test_resume_after_the_last_batch_runs_only_the_epoch_end(self):
        first = osp.join(self.temp_dir.name, 'first')
        self._train(self._cfg(first, seed=0))
        second = osp.join(self.temp_dir.name, 'second')
        resumed = self._train(
            self._cfg(second, seed=0, resume=True, load_from=osp.join(first, 'iter_4.pth')))
        self.assertEqual([it for it, _, _ in resumed], [5, 6, 7, 8])

    def test_loop_configs(self):
        for given, built in (
            (dict(by_epoch=True, max_epochs=3), dict(type='ResumableEpochLoop', max_epochs=3)),
            (dict(type='EpochBasedTrainLoop',
                  max_epochs=3), dict(type='ResumableEpochLoop', max_epochs=3)),
            (dict(by_epoch=False, max_iters=5), dict(type='ResumableIterLoop', max_iters=5)),
            (dict(type='IterBasedTrainLoop',
                  max_iters=5), dict(type='ResumableIterLoop', max_iters=5)),
            (dict(type='MyLoop', max_epochs=3), dict(type='MyLoop', max_epochs=3)),  # kept
            (dict(max_epochs=3), dict(max_epochs=3)),
        ):
            self.assertEqual(resumable_loop_cfg(given), built)
        self.assertTrue(issubclass(ResumableEpochLoop, EpochBasedTrainLoop))
        self.assertFalse(issubclass(IterBasedTrainLoop, ResumableEpochLoop))

    def test_sampler_skips_only_its_next_pass(self):
        sampler = ResumableSampler(list(range(10)), shuffle=False, seed=0)
        sampler.skip = 4
        self.assertEqual(list(sampler), [4, 5, 6, 7, 8, 9])
        self.assertEqual(list(sampler), list(range(10)))
