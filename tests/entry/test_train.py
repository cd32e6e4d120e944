"""One pass from every entry: the ``scaling`` block is parsed once and planned once, whether
``tools/dist_train.py``'s entry checks it before the rendezvous and hands it to the runner, or
the runner is built by another entry point (MMPose's ``tools/train.py`` calls
``Runner.from_cfg``), or ``--explain`` prints it.

In-process, on MMEngine's toy runner (12 samples, batch 3) and on the demo config."""
import copy

import pytest
from mmengine.runner import Runner
from mmengine.testing import RunnerTestCase

import mmddp_ext.scaling.apply as apply_module
from mmddp_ext.entry.train import build_runner, check_config, main
from mmddp_ext.runner.ddp_runner import DDPRunner

from conftest import DEMO_CONFIG


class Counted:
    """Counts the calls of the scaling layer's parser and planner (as the code calls them:
    through ``mmddp_ext.scaling.apply``'s names)."""

    def __init__(self, monkeypatch) -> None:
        self.calls = {'parse_scaling': 0, 'make_plan': 0}
        for name in self.calls:
            monkeypatch.setattr(apply_module, name, self._counting(name,
                                                                   getattr(apply_module, name)))

    def _counting(self, name, fn):

        def wrapper(*args, **kwargs):
            self.calls[name] += 1
            return fn(*args, **kwargs)

        return wrapper


class TestOnePass(RunnerTestCase):

    @pytest.fixture(autouse=True)
    def _patch(self, monkeypatch):
        self.monkeypatch = monkeypatch

    def _cfg(self, **scaling):
        cfg = copy.deepcopy(self.epoch_based_cfg)
        cfg.runner_type = 'DDPRunner'
        cfg.scaling = dict(global_batch_size=6, **scaling)  # batch 3 on 1 process: 3 × 2
        cfg.experiment_name = self.experiment_name
        return cfg

    def test_the_entry_checks_once_and_the_runner_reuses_it(self):
        cfg = self._cfg()
        counted = Counted(self.monkeypatch)
        checked = check_config(cfg, 1, False)
        runner = build_runner(cfg, checked)
        self.assertIsInstance(runner, DDPRunner)
        self.assertEqual(counted.calls, {'parse_scaling': 1, 'make_plan': 1})
        self.assertIs(runner.scaling_plan, checked.plan)
        self.assertEqual(
            (runner.scaling_plan.per_device_batch_size, runner.scaling_plan.accumulative_counts),
            (3, 2))
        self.assertEqual(runner.cfg.optim_wrapper.accumulative_counts, 2)

    def test_another_entry_point_parses_and_plans_once_too(self):
        counted = Counted(self.monkeypatch)
        runner = Runner.from_cfg(self._cfg())  # MMPose's tools/train.py
        self.assertIsInstance(runner, DDPRunner)
        self.assertEqual(counted.calls, {'parse_scaling': 1, 'make_plan': 1})
        self.assertEqual(runner.scaling_plan.accumulative_counts, 2)

    def test_a_check_for_another_world_size_is_not_reused(self):
        cfg = self._cfg()
        checked = check_config(cfg, 2, True)  # planned for 2 processes; this one is alone
        self.assertEqual(checked.plan.accumulative_counts, 1)
        counted = Counted(self.monkeypatch)
        runner = build_runner(cfg, checked)
        self.assertEqual(counted.calls, {'parse_scaling': 1, 'make_plan': 1})
        self.assertEqual((runner.scaling_plan.world_size, runner.scaling_plan.accumulative_counts),
                         (1, 2))


def test_explain_parses_and_plans_once(monkeypatch, capsys):
    counted = Counted(monkeypatch)
    assert main([DEMO_CONFIG, '--explain', '--json', '--world-size', '2']) == 0
    assert '"per_device_batch_size": 16' in capsys.readouterr().out
    assert counted.calls == {'parse_scaling': 1, 'make_plan': 1}
