"""PreemptionHook in-process, on MMEngine's toy runner (12 samples, batch 3: 4 iterations per
epoch, 2 epochs): a signal to this process stops training after the iteration it came in,
with one checkpoint that ``--resume`` continues from; the real multi-rank runs are in
tests/e2e/test_preemption.py and tests/slurm/test_preemption.py."""
import copy
import os
import os.path as osp
import signal

import pytest
import torch
from mmengine.hooks import Hook
from mmengine.runner import Runner
from mmengine.testing import RunnerTestCase

from mmddp_ext.hooks import PreemptionHook, TrainingStopped


class _SignalAt(Hook):
    """Sends ``signum`` to this process during iteration ``iteration`` (from 1)."""

    priority = 'VERY_LOW'

    def __init__(self, iteration: int, signum: int = signal.SIGUSR1) -> None:
        self.iteration, self.signum, self.trained = iteration, signum, []

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        if runner.iter + 1 == self.iteration:
            os.kill(os.getpid(), self.signum)

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self.trained.append(runner.iter + 1)


class TestPreemptionHook(RunnerTestCase):

    def _runner(self, work_dir, loop='ResumableEpochLoop', signals=('SIGUSR1', ), **extra):
        cfg = copy.deepcopy(self.epoch_based_cfg)
        cfg.train_cfg = dict(type=loop, max_epochs=2, val_interval=2)
        cfg.custom_hooks = [dict(type='PreemptionHook', signals=list(signals))]
        cfg.work_dir = work_dir
        cfg.experiment_name = f'{self.experiment_name}_{osp.basename(work_dir)}'
        cfg.update(extra)
        return Runner.from_cfg(cfg)

    def test_signal_stops_after_its_iteration_with_one_checkpoint(self):
        work = osp.join(self.temp_dir.name, 'w')
        runner = self._runner(work)
        sender = _SignalAt(6)
        runner.register_hook(sender)
        previous = signal.getsignal(signal.SIGUSR1)
        runner.train()
        hook = next(h for h in runner.hooks if isinstance(h, PreemptionHook))
        self.assertEqual(sender.trained, [1, 2, 3, 4, 5, 6])
        path = osp.join(work, 'iter_6.pth')
        self.assertEqual(
            hook.stopped,
            dict(signal='SIGUSR1', iteration=6, epoch=2, batch=2, checkpoint=path, requeued=False))
        meta = torch.load(path, map_location='cpu', weights_only=False)['meta']
        self.assertEqual((meta['epoch'], meta['iter']), (1, 6))
        self.assertEqual(open(osp.join(work, 'last_checkpoint')).read().strip(), path)
        self.assertFalse(osp.exists(osp.join(work, 'epoch_2.pth')))  # the epoch did not end
        self.assertEqual(signal.getsignal(signal.SIGUSR1), hook._handle)  # inert after the run
        signal.signal(signal.SIGUSR1, previous)

        resumed = self._runner(osp.join(self.temp_dir.name, 'w2'), resume=True, load_from=path)
        sender = _SignalAt(0)
        resumed.register_hook(sender)
        resumed.train()
        self.assertEqual(sender.trained, [7, 8])

    def test_a_loop_that_cannot_stop_mid_epoch_saves_and_raises(self):
        work = osp.join(self.temp_dir.name, 'w')
        runner = self._runner(work, loop='EpochBasedTrainLoop')
        runner.register_hook(_SignalAt(2))
        previous = signal.getsignal(signal.SIGUSR1)
        with self.assertRaises(TrainingStopped) as caught:
            runner.train()
        signal.signal(signal.SIGUSR1, previous)
        self.assertEqual(caught.exception.code, 75)
        self.assertTrue(osp.isfile(osp.join(work, 'iter_2.pth')))

    def test_bad_arguments_are_named(self):
        with pytest.raises(ValueError, match="'SIGNOPE' is not a signal of this system"):
            PreemptionHook(signals=['SIGNOPE'])
        with pytest.raises(ValueError, match='interval=0 must be a whole number'):
            PreemptionHook(interval=0)
        self.assertEqual(list(PreemptionHook(signals='USR1').signals.values()), ['SIGUSR1'])
