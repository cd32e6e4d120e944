"""RankEvaluation on MMEngine's toy runner: the evaluators it builds wait with the
hang watchdog's metric bound; an evaluator of the config's own class is kept."""
from mmengine.evaluator import Evaluator
from mmengine.registry import EVALUATOR
from mmengine.runner import Runner
from mmengine.testing import RunnerTestCase

from mmddp_ext.hooks.watchdog_hook import METRIC_GRACE
from mmddp_ext.runner.evaluation import DEFAULT_WAIT, PatientEvaluator, RankEvaluation


class PatientRunner(RankEvaluation, Runner):
    pass


@EVALUATOR.register_module(force=True)
class OwnEvaluator(Evaluator):
    pass


class TestPatientEvaluation(RunnerTestCase):

    def _runner(self, **changes) -> PatientRunner:
        cfg = self.epoch_based_cfg
        for key, value in changes.items():
            cfg[key] = value
        return PatientRunner.from_cfg(cfg)

    def test_metrics_wait_with_the_watchdogs_bound(self):
        runner = self._runner(custom_hooks=[dict(type='HangWatchdogHook', metric_timeout=90)])
        for loop in (runner.val_loop, runner.test_loop):
            self.assertIs(type(loop.evaluator), PatientEvaluator)
            self.assertEqual([type(m).__name__ for m in loop.evaluator.metrics], ['ToyMetric'])
            self.assertEqual(loop.evaluator.wait_seconds(), 90 + 2 * METRIC_GRACE)
        self.assertIsNotNone(runner.val_loop.evaluator.dataset_meta)  # set by the loop after
        runner.train()  # validates through it, one process

    def test_without_a_watchdog_the_default_wait(self):
        runner = self._runner()
        self.assertEqual(runner.val_loop.evaluator.wait_seconds(), DEFAULT_WAIT)

    def test_an_evaluator_of_its_own_class_is_kept(self):
        runner = self._runner(
            val_evaluator=dict(type='OwnEvaluator', metrics=[dict(type='ToyMetric')]))
        self.assertIs(type(runner.val_loop.evaluator), OwnEvaluator)

    def test_an_evaluator_object_is_returned_as_it_is(self):
        runner = self._runner()
        given = Evaluator([dict(type='ToyMetric')])
        self.assertIs(runner.build_evaluator(given), given)
