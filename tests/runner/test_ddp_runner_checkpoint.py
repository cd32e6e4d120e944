"""DDPRunner writes checkpoints that plain ``torch.load`` opens (``weights_only=True``, no
allowlist) and resumes from them exactly: message hub history buffers, numpy dataset meta and
a numpy best score come back as they were saved.

In-process, on MMEngine's toy runner with a dataset whose metainfo holds numpy arrays and a
metric that returns a numpy scalar (so ``best_score`` in the message hub is one)."""
import copy
import os.path as osp
import pickle

import numpy as np
import torch
from mmengine.evaluator import BaseMetric
from mmengine.hooks import Hook
from mmengine.logging import HistoryBuffer
from mmengine.registry import DATASETS, HOOKS, METRICS
from mmengine.runner import CheckpointLoader
from mmengine.testing import RunnerTestCase
from mmengine.testing.runner_test_case import ToyDataset

from mmddp_ext.runner.ddp_runner import DDPRunner


class NumpyMetaToyDataset(ToyDataset):
    METAINFO = dict(
        sigmas=np.array([0.026, 0.025, 0.035], np.float32), flip_indices=np.arange(3),
        names=np.array(['nose', 'eye', 'ear']))


class NumpyScoreMetric(BaseMetric):

    def process(self, data_batch, data_samples) -> None:
        self.results.append(1)

    def compute_metrics(self, results) -> dict:
        return dict(acc=np.float64(0.75))


class RecordSaveHook(Hook):
    """Adds a numpy value as a hook may, then keeps what MMEngine would have written."""

    priority = 'LOWEST'

    def __init__(self) -> None:
        self.saved = []

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        checkpoint['meta']['hook_value'] = np.float32(1.5)
        self.saved.append(copy.deepcopy(checkpoint))


def load_from_plaintest(filename: str, map_location=None):
    """A loader of another scheme (as for remote files): plain torch.load, nothing restored."""
    return torch.load(filename[len('plaintest://'):], map_location=map_location, weights_only=True)


def _plain_only(obj, where='checkpoint'):
    """Every non-container leaf is a tensor or a plain Python value."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            _plain_only(value, f'{where}[{key!r}]')
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            _plain_only(value, f'{where}[{i}]')
    else:
        assert obj is None or isinstance(obj, (torch.Tensor, bool, int, float, str)), \
            f'{where} is {type(obj).__name__}'
        assert not isinstance(obj, np.generic), f'{where} is {type(obj).__name__}'


class TestPlainCheckpoints(RunnerTestCase):

    def setUp(self) -> None:
        super().setUp()
        DATASETS.register_module(module=NumpyMetaToyDataset, force=True)
        METRICS.register_module(module=NumpyScoreMetric, force=True)
        HOOKS.register_module(module=RecordSaveHook, force=True)

    def tearDown(self) -> None:
        for registry, name in ((DATASETS, 'NumpyMetaToyDataset'), (METRICS, 'NumpyScoreMetric'),
                               (HOOKS, 'RecordSaveHook')):
            registry.module_dict.pop(name, None)
        super().tearDown()

    def _cfg(self, max_epochs: int):
        cfg = copy.deepcopy(self.epoch_based_cfg)
        cfg.train_dataloader.dataset.type = 'NumpyMetaToyDataset'
        cfg.val_evaluator = [dict(type='NumpyScoreMetric')]
        cfg.train_cfg = dict(by_epoch=True, max_epochs=max_epochs, val_interval=1)
        cfg.default_hooks = dict(
            logger=dict(type='LoggerHook', interval=1),
            checkpoint=dict(type='CheckpointHook', interval=1, save_best='acc', rule='greater'))
        cfg.custom_hooks = [dict(type='RecordSaveHook')]
        cfg.experiment_name = self.experiment_name
        return cfg

    def _train(self, max_epochs: int):
        runner = DDPRunner.from_cfg(self._cfg(max_epochs))
        runner.train()
        recorder = next(h for h in runner.hooks if isinstance(h, RecordSaveHook))
        return runner, recorder

    def test_plain_torch_load_opens_it(self):
        self._train(2)
        path = osp.join(self.temp_dir.name, 'epoch_2.pth')
        ckpt = torch.load(path, weights_only=True)  # no allowlist
        _plain_only(ckpt)
        self.assertEqual(ckpt['meta']['epoch'], 2)
        # converted after every hook ran before_save_checkpoint
        self.assertEqual(ckpt['meta']['hook_value']['value'], 1.5)
        self.assertTrue(osp.exists(osp.join(self.temp_dir.name, 'best_acc_epoch_1.pth')))

    def test_resume_restores_what_was_saved(self):
        _, recorder = self._train(2)
        saved = recorder.saved[-1]  # epoch_2.pth as MMEngine would have written it
        runner = DDPRunner.from_cfg(self._cfg(3))
        with self.assertLogs(runner.logger, level='INFO') as logs:
            runner.resume(osp.join(self.temp_dir.name, 'epoch_2.pth'))
        self.assertFalse([line for line in logs.output if 'metainfo' in line])
        hub = runner.message_hub
        self.assertEqual(set(hub.log_scalars), set(saved['message_hub']['log_scalars']))
        for key, before in saved['message_hub']['log_scalars'].items():
            after = hub.log_scalars[key]
            self.assertIs(type(after), HistoryBuffer)
            self.assertEqual(after.max_length, before.max_length)
            for now, then in zip(after.data, before.data):
                self.assertEqual(now.dtype, then.dtype)
                np.testing.assert_array_equal(now, then)
        best = hub.get_info('best_score')
        self.assertIs(type(best), np.float64)
        saved_info = saved['message_hub']['runtime_info']
        self.assertEqual(best, saved_info['best_score'])
        self.assertEqual(hub.get_info('best_ckpt'), saved_info['best_ckpt'])

    def test_resumed_run_continues_like_an_uninterrupted_one(self):
        self._train(2)
        resumed = DDPRunner.from_cfg(self._cfg(3))
        resumed.resume(osp.join(self.temp_dir.name, 'epoch_2.pth'))
        resumed.train()
        whole, _ = self._train(3)
        for key in ('train/loss', 'train/lr'):
            self.assertEqual(
                len(resumed.message_hub.log_scalars[key].data[0]),
                len(whole.message_hub.log_scalars[key].data[0]))
        for key in ('best_score', 'best_ckpt'):
            self.assertEqual(resumed.message_hub.get_info(key), whole.message_hub.get_info(key))

    def test_mmengine_format_checkpoint_still_resumes(self):
        _, recorder = self._train(2)
        old = osp.join(self.temp_dir.name, 'mmengine_format.pth')
        torch.save(recorder.saved[-1], old)  # HistoryBuffer and numpy objects pickled
        with self.assertRaises(pickle.UnpicklingError):
            torch.load(old, weights_only=True)
        runner = DDPRunner.from_cfg(self._cfg(3))
        runner.resume(old)  # through mmddp_ext's allowlist loader
        self.assertEqual(runner.epoch, 2)
        self.assertIs(type(runner.message_hub.log_scalars['train/loss']), HistoryBuffer)
        self.assertIs(type(runner.message_hub.get_info('best_score')), np.float64)

    def test_restored_for_loaders_of_other_schemes_too(self):
        _, recorder = self._train(2)
        CheckpointLoader.register_scheme('plaintest://', load_from_plaintest, force=True)
        try:
            runner = DDPRunner.from_cfg(self._cfg(3))
            runner.resume('plaintest://' + osp.join(self.temp_dir.name, 'epoch_2.pth'))
        finally:
            CheckpointLoader._schemes.pop('plaintest://', None)
        self.assertIs(type(runner.message_hub.log_scalars['train/loss']), HistoryBuffer)
        np.testing.assert_array_equal(
            runner.message_hub.log_scalars['train/loss'].data[0],
            recorder.saved[-1]['message_hub']['log_scalars']['train/loss'].data[0])
        self.assertIs(type(runner.message_hub.get_info('best_score')), np.float64)
