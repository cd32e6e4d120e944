"""FiniteLossHook (stop / warn / skip) and the runner's refusal to save non-finite weights.

In-process, on MMEngine's toy runner (12 samples, batch 3: 4 iterations per epoch, SGD lr 0.1),
with :class:`tests.helpers.nan_loss_hook.NanLossHook` making the loss NaN at one iteration.
The real two-process run is ``tests/e2e/test_nonfinite.py``."""
import copy
import os
import os.path as osp

import pytest
import torch
from mmengine.evaluator import BaseMetric
from mmengine.hooks import CheckpointHook, Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS, METRICS
from mmengine.runner import Runner
from mmengine.testing import RunnerTestCase

from mmddp_ext.hooks.finite_checkpoint_hook import FiniteCheckpointHook, NonFiniteRefusal
from mmddp_ext.hooks.finite_loss_hook import (FiniteLossHook, NonFiniteLossError, format_lr,
                                              nonfinite_grads, nonfinite_terms)
from mmddp_ext.runner.ddp_runner import DDPRunner

from tests.helpers.nan_loss_hook import NanLossHook

NAN, INF = float('nan'), float('inf')
NOT_BUILT = dict(save_optimizer=False, save_param_scheduler=False)  # before train()


@pytest.mark.parametrize(
    'log_vars, expected',
    [
        ({
            'loss': torch.tensor(1.0),
            'loss_kpt': torch.tensor(1.0)
        }, {}),
        ({
            'loss': torch.tensor(NAN),
            'loss_kpt': torch.tensor(NAN),
            'acc_pose': 0.5
        }, {
            'loss_kpt': NAN
        }),
        ({
            'loss': torch.tensor(INF),
            'loss_a': torch.tensor(INF),
            'loss_b': torch.tensor(-INF)
        }, {
            'loss_a': INF,
            'loss_b': -INF
        }),
        ({
            'loss': torch.tensor(INF),
            'loss_a': torch.tensor(3e38),
            'loss_b': torch.tensor(3e38)
        }, {
            'loss': INF
        }),  # only the total overflowed
        ({
            'loss': torch.tensor(1.0),
            'acc_pose': torch.tensor(NAN)
        }, {}),  # not a loss term
        ({
            'loss': torch.tensor([1.0, NAN, INF])
        }, {
            'loss': NAN
        }),
        ({
            'loss': 2.0,
            'loss_x': float('nan')
        }, {
            'loss_x': NAN
        }),
        ({
            'loss_count': torch.tensor(3)
        }, {}),
        (None, {}),
    ])
def test_nonfinite_terms(log_vars, expected):
    got = nonfinite_terms(log_vars)
    assert list(got) == list(expected)
    assert all(str(got[k]) == str(v) for k, v in expected.items())


def test_nonfinite_grads_names_the_bad_ones_only():
    params = [torch.nn.Parameter(torch.zeros(3)) for _ in range(4)]
    params[0].grad = torch.ones(3)
    params[1].grad = torch.tensor([1.0, NAN, 0.0])
    params[3].grad = torch.tensor([INF, 0.0, 0.0])  # params[2] has no gradient
    assert nonfinite_grads(params) == [1, 3]
    assert nonfinite_grads(params[2:3]) == []


@pytest.mark.parametrize('bad, hint', [('stp', "did you mean 'stop'"), ('Skip', "'skip'"),
                                       (None, 'stop, warn, skip')])
def test_action_is_checked(bad, hint):
    with pytest.raises(ValueError, match=f'action={bad!r} is not one of') as e:
        FiniteLossHook(action=bad)
    assert hint in str(e.value) and "default_hooks.finite_loss=dict(action='warn')" in str(e.value)


class CountingMetric(BaseMetric):
    """``acc`` = how many validations ran so far: every epoch is a new best."""

    calls = 0

    def process(self, data_batch, data_samples) -> None:
        self.results.append(1)

    def compute_metrics(self, results) -> dict:
        CountingMetric.calls += 1
        return dict(acc=float(CountingMetric.calls))


class ProjectCheckpointHook(CheckpointHook):
    """A project's own ``CheckpointHook`` subclass that counts its saves."""

    saves = 0

    def _save_checkpoint(self, runner) -> None:
        self.saves += 1
        super()._save_checkpoint(runner)


class ParamRecorder(Hook):
    """The parameters after every iteration, and the logged loss."""

    priority = 'LOWEST'

    def __init__(self) -> None:
        self.params, self.losses = [], []

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        self.params.append([p.detach().clone() for p in model.parameters()])
        self.losses.append(float(outputs['loss'].detach()))


def _same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


class TestFiniteLossHook(RunnerTestCase):

    def setUp(self) -> None:
        super().setUp()
        CountingMetric.calls = 0
        METRICS.register_module(module=CountingMetric, force=True)
        HOOKS.register_module(module=ParamRecorder, force=True)
        HOOKS.register_module(module=NanLossHook, force=True)

    def tearDown(self) -> None:
        METRICS.module_dict.pop('CountingMetric', None)
        HOOKS.module_dict.pop('ParamRecorder', None)
        super().tearDown()

    def _cfg(self, action=None, iteration=3, epochs=2, **optim):
        cfg = copy.deepcopy(self.epoch_based_cfg)
        cfg.train_cfg = dict(by_epoch=True, max_epochs=epochs, val_interval=1)
        cfg.val_evaluator = [dict(type='CountingMetric')]
        cfg.optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.1), **optim)
        cfg.default_hooks = dict(
            logger=dict(type='LoggerHook', interval=1),
            checkpoint=dict(type='CheckpointHook', interval=1, max_keep_ckpts=1, save_best='acc',
                            rule='greater'))
        hooks = [dict(type='NanLossHook', rank=0, iteration=iteration), dict(type='ParamRecorder')]
        if action is not None:
            hooks.append(dict(type='FiniteLossHook', action=action))
        cfg.custom_hooks = hooks
        cfg.experiment_name = self.experiment_name
        return cfg

    def _files(self):
        return sorted(
            f for f in os.listdir(self.temp_dir.name)
            if f.endswith('.pth') or f == 'last_checkpoint')

    @staticmethod
    def _hook(runner, kind):
        return next(h for h in runner.hooks if isinstance(h, kind))

    def test_added_by_default_once(self):
        runner = DDPRunner.from_cfg(self._cfg())
        hooks = [h for h in runner.hooks if isinstance(h, FiniteLossHook)]
        self.assertEqual([h.action for h in hooks], ['stop'])
        cfg = self._cfg('warn')
        cfg.experiment_name = self.experiment_name
        runner = DDPRunner.from_cfg(cfg)
        hooks = [h for h in runner.hooks if isinstance(h, FiniteLossHook)]
        self.assertEqual([h.action for h in hooks], ['warn'])

    def test_stop_raises_at_the_first_nan_with_rank_iteration_terms_and_lr(self):
        runner = DDPRunner.from_cfg(self._cfg())
        with self.assertRaises(NonFiniteLossError) as e:
            runner.train()
        err = e.exception
        self.assertEqual((err.rank, err.iteration, err.lr), (0, 3, '1.0e-01'))
        self.assertEqual(list(err.terms), ['loss'])
        self.assertEqual(
            str(err), "non-finite loss on rank 0 at iteration 3: loss=nan (lr 1.0e-01); "
            "stopping (FiniteLossHook action='stop'; to go on instead, set "
            "default_hooks.finite_loss=dict(action='warn') or action='skip')")
        self.assertNotIn('\n', str(err))
        self.assertEqual(len(self._hook(runner, ParamRecorder).losses), 2)  # 3rd: raised first
        self.assertEqual(self._files(), [])  # the first checkpoint was due after iteration 4

    def test_warn_goes_on_and_nothing_nonfinite_is_saved_or_made_best(self):
        # NaN at iteration 5 (epoch 2): epoch 1 is saved and is the best; epoch 2 would be a
        # better "best" (the metric grows) and max_keep_ckpts=1 would remove epoch_1.pth
        runner = DDPRunner.from_cfg(self._cfg('warn', iteration=5))
        with self.assertLogs(runner.logger, level='WARNING') as logs:
            runner.train()
        text = '\n'.join(logs.output)
        self.assertIn(
            "[mmddp_ext] non-finite loss on rank 0 at iteration 5: loss=nan (lr "
            "1.0e-01); action='warn': training goes on", text)
        losses = self._hook(runner, ParamRecorder).losses
        self.assertEqual(len(losses), 8)  # trained to the end, on NaN weights
        self.assertTrue(all(x != x for x in losses[4:]))
        self.assertEqual(self._hook(runner, FiniteLossHook).nonfinite, 4)
        # said at the 1st, 2nd, 4th occurrence
        self.assertEqual(text.count('non-finite loss on rank 0'), 3)
        self.assertIn(
            'refusing to save epoch_2.pth: 4 of 4 weight tensors are not finite '
            '(linear1.weight, linear1.bias, linear2.weight, ...); earlier '
            'checkpoints are kept', text)
        self.assertIn(
            'refusing to save epoch 2 as a best checkpoint (its score is not compared): '
            '4 of 4 weight tensors are not finite', text)
        self.assertIsInstance(self._hook(runner, CheckpointHook), FiniteCheckpointHook)
        self.assertEqual(self._files(), ['best_acc_epoch_1.pth', 'epoch_1.pth', 'last_checkpoint'])
        with open(osp.join(self.temp_dir.name, 'last_checkpoint')) as f:
            self.assertEqual(osp.basename(f.read()), 'epoch_1.pth')
        hub = runner.message_hub
        self.assertEqual(hub.get_info('best_score'), 1.0)
        self.assertEqual(osp.basename(hub.get_info('best_ckpt')), 'best_acc_epoch_1.pth')
        saved = torch.load(osp.join(self.temp_dir.name, 'epoch_1.pth'), weights_only=True)
        self.assertTrue(all(torch.isfinite(t).all() for t in saved['state_dict'].values()))

    def _refuses_on(self, runner):
        """Train ``runner`` (NaN from iteration 5, 'warn'); assert nothing non-finite was
        saved, recorded or made best."""
        with self.assertLogs(runner.logger, level='WARNING') as logs:
            runner.train()
        text = '\n'.join(logs.output)
        self.assertIn('refusing to save epoch_2.pth', text)
        self.assertIn('refusing to save epoch 2 as a best checkpoint', text)
        self.assertEqual(self._files(), ['best_acc_epoch_1.pth', 'epoch_1.pth', 'last_checkpoint'])
        self.assertEqual(runner.message_hub.get_info('best_score'), 1.0)

    def test_a_projects_own_checkpoint_hook_gets_the_check_mixed_in(self):
        HOOKS.register_module(module=ProjectCheckpointHook, force=True)
        self.addCleanup(HOOKS.module_dict.pop, 'ProjectCheckpointHook', None)
        cfg = self._cfg('warn', iteration=5)
        cfg.default_hooks.checkpoint.type = 'ProjectCheckpointHook'
        runner = DDPRunner.from_cfg(cfg)
        hook = self._hook(runner, CheckpointHook)
        self.assertIsInstance(hook, ProjectCheckpointHook)
        self.assertIsInstance(hook, NonFiniteRefusal)
        self._refuses_on(runner)
        self.assertGreater(hook.saves, 0)  # the project's own override still runs

    def test_finite_checkpoint_hook_guards_mmengines_own_runner(self):
        cfg = self._cfg('warn', iteration=5)
        cfg.default_hooks.checkpoint.type = 'FiniteCheckpointHook'
        runner = Runner.from_cfg(cfg)
        self.assertNotIsInstance(runner, DDPRunner)  # no refusal by the runner: the hook alone
        self.assertIsInstance(self._hook(runner, CheckpointHook), FiniteCheckpointHook)
        self._refuses_on(runner)

    def test_without_the_check_mmengine_records_the_non_finite_save(self):
        # negative control: a stock CheckpointHook under MMEngine's Runner removes epoch_1.pth
        # and names a best checkpoint that holds NaN weights
        runner = Runner.from_cfg(self._cfg('warn', iteration=5))
        runner.train()
        self.assertEqual(self._files(), ['best_acc_epoch_2.pth', 'epoch_2.pth', 'last_checkpoint'])

    def test_validation_alone_builds_no_train_loop(self):
        # as MMEngine's own test_val asserts: the checkpoint hook's best-save path, without
        # save_best, must not touch runner.epoch (which builds the train loop)
        cfg = copy.deepcopy(self.epoch_based_cfg)
        cfg.experiment_name = self.experiment_name
        runner = DDPRunner.from_cfg(cfg)
        runner.val()
        self.assertIsInstance(runner._train_loop, dict)

    def test_save_checkpoint_itself_refuses(self):
        runner = DDPRunner.from_cfg(self._cfg())
        with torch.no_grad():
            runner.model.linear2.bias.fill_(INF)
        with self.assertLogs(runner.logger, level='WARNING') as logs:
            runner.save_checkpoint(self.temp_dir.name, 'manual.pth', **NOT_BUILT)
        self.assertEqual(
            logs.output[-1].split(':', 2)[-1],
            '[mmddp_ext] refusing to save manual.pth: 1 of 4 weight tensors are '
            'not finite (linear2.bias); earlier checkpoints are kept')
        self.assertEqual(self._files(), [])
        with torch.no_grad():
            runner.model.linear2.bias.fill_(0.0)
        runner.save_checkpoint(self.temp_dir.name, 'manual.pth', **NOT_BUILT)
        self.assertEqual(self._files(), ['manual.pth'])

    def test_a_non_finite_buffer_alone_is_refused_too(self):
        """Weights finite, one floating-point buffer NaN (running statistics that a forward
        pass of NaN activations leaves): the save is refused and names the buffer; an integer
        buffer (a counter) is not a weight tensor."""
        runner = DDPRunner.from_cfg(self._cfg())
        runner.model.register_buffer('running_mean', torch.zeros(2))
        runner.model.register_buffer('num_batches_tracked', torch.tensor(0, dtype=torch.long))
        runner.model.running_mean.fill_(float('nan'))
        with self.assertLogs(runner.logger, level='WARNING') as logs:
            runner.save_checkpoint(self.temp_dir.name, 'manual.pth', **NOT_BUILT)
        self.assertEqual(
            logs.output[-1].split(':', 2)[-1],
            '[mmddp_ext] refusing to save manual.pth: 1 of 5 weight tensors are '
            'not finite (running_mean); earlier checkpoints are kept')
        self.assertEqual(self._files(), [])
        runner.model.running_mean.fill_(0.0)
        runner.save_checkpoint(self.temp_dir.name, 'manual.pth', **NOT_BUILT)
        self.assertEqual(self._files(), ['manual.pth'])

    def _skip_run(self, runner_cls=DDPRunner, **cfg_extra):
        cfg = self._cfg('skip', **cfg_extra.pop('cfg', {}))
        cfg.update(cfg_extra)
        runner = runner_cls.from_cfg(cfg)
        with self.assertLogs(runner.logger, level='WARNING') as logs:
            runner.train()
        return runner, '\n'.join(logs.output)

    def test_skip_drops_the_step_and_training_goes_on(self):
        runner, text = self._skip_run()
        record = self._hook(runner, ParamRecorder)
        self.assertTrue(_same(record.params[2], record.params[1]))  # iteration 3: no step
        self.assertFalse(_same(record.params[3], record.params[2]))  # iteration 4: a step
        self.assertTrue(all(x == x for i, x in enumerate(record.losses) if i != 2))
        self.assertEqual(self._hook(runner, FiniteLossHook).skipped, 1)
        self.assertIn(
            'optimizer step skipped at iteration 3 on every rank: 4 of 4 gradients '
            'are not finite after averaging over ranks (linear1.weight, '
            'linear1.bias, linear2.weight, ...); 1 step(s) skipped so far', text)
        self.assertIn(
            "loss=nan (lr 1.0e-01); action='skip': optimizer steps with non-finite "
            'gradients are skipped', text)
        self.assertEqual(self._files(), ['best_acc_epoch_2.pth', 'epoch_2.pth', 'last_checkpoint'])

    def test_skip_with_accumulation_drops_the_whole_cycle(self):
        # stock MMEngine Runner and OptimWrapper: a step every 2nd iteration; NaN at 3 → the
        # step at 4 is skipped and the NaN gradients do not leak into the next cycle
        runner, _ = self._skip_run(Runner, cfg=dict(accumulative_counts=2))
        params = self._hook(runner, ParamRecorder).params
        self.assertFalse(_same(params[1], params[0]))  # step at 2
        self.assertTrue(_same(params[2], params[1]))  # 3: accumulating
        self.assertTrue(_same(params[3], params[1]))  # 4: skipped
        self.assertFalse(_same(params[5], params[3]))  # 6: a step, finite
        self.assertTrue(all(torch.isfinite(p).all() for p in params[-1]))
        self.assertEqual(self._hook(runner, FiniteLossHook).skipped, 1)

    def test_skip_with_microbatch_ddp(self):
        runner, _ = self._skip_run(model_wrapper_cfg=dict(type='MicrobatchDDP'))
        self.assertEqual(type(runner.model).__name__, 'MicrobatchDDP')
        params = self._hook(runner, ParamRecorder).params
        self.assertTrue(_same(params[2], params[1]))
        self.assertFalse(_same(params[3], params[2]))
        self.assertTrue(all(torch.isfinite(p).all() for p in params[-1]))
        self.assertEqual(self._hook(runner, FiniteLossHook).skipped, 1)


def test_format_lr():

    class Wrapper:

        def __init__(self, lrs):
            self.lrs = lrs

        def get_lr(self):
            return self.lrs

    assert format_lr(Wrapper({'lr': [5e-4, 5e-4]})) == '5.0e-04'
    assert format_lr(Wrapper({'backbone.lr': [1e-4], 'head.lr': [1e-3]})) == \
        'backbone 1.0e-04 / head 1.0e-03'
    assert format_lr(object()) == '?'
