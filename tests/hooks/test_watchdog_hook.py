"""HangWatchdogHook: the bound, the progress file on MMEngine's toy runner, and a real hang
ended by the interpreter's own watchdog with every thread's stack written."""
import os.path as osp
import subprocess
import sys

import pytest
from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from mmengine.testing import RunnerTestCase

from mmddp_ext.diagnose.records import read_ranks, stacks_path
from mmddp_ext.diagnose.stacks import main_frames, parse_dump
from mmddp_ext.hooks import HangWatchdogHook
from mmddp_ext.hooks.watchdog_hook import METRIC_GRACE, metric_bound, watchdog_bound

from tests.helpers import toy_hang
from tests.helpers.proc_status import proc_status

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


@pytest.mark.parametrize(
    'times,timeout,expected',
    [
        ([], None, None),  # nothing timed yet: the start-up bound applies
        ([0.6, 0.5], None, 120.0),  # fast iterations: the minimum
        ([30.0, 12.0], None, 300.0),  # 10 x the slowest
        ([30.0], 45, 45.0),  # a fixed bound wins
    ])
def test_bound(times, timeout, expected):
    assert watchdog_bound(times, timeout, factor=10, min_timeout=120) == expected


@pytest.mark.parametrize(
    'times,metric_timeout,expected',
    [
        ([], None, 3600.0),  # the first computation: an hour
        ([40.0], None, 600.0),  # 10 x 40 s is below the slow phases' bound
        ([40.0, 300.0], None, 3000.0),  # 10 x the longest
        ([40.0], 90, 90.0),  # a fixed bound wins
    ])
def test_metric_bound(times, metric_timeout, expected):
    assert metric_bound(times, metric_timeout, factor=10, slow_timeout=600) == expected


@pytest.mark.parametrize('kwargs,name', [(dict(timeout=0), 'timeout=0'),
                                         (dict(metric_timeout=-5), 'metric_timeout=-5'),
                                         (dict(report_every=0), 'report_every=0'),
                                         (dict(factor=-1), 'factor=-1'),
                                         (dict(window=True), 'window=True')])
def test_bad_arguments_name_the_value(kwargs, name):
    with pytest.raises(ValueError, match=name):
        HangWatchdogHook(**kwargs)


@HOOKS.register_module(force=True)
class VmRssProbeHook(Hook):
    """Reads /proc's VmRSS at ``after_run``; placed just before and just after the watchdog
    (the same priority, in that order), it brackets the watchdog's last reading."""

    priority = 'VERY_HIGH'

    def after_run(self, runner) -> None:
        self.rss = proc_status('VmRSS')['VmRSS']


@HOOKS.register_module(force=True)
class WatchdogProbeHook(Hook):
    """Reads the watchdog's phase and bound after each validation batch (after the watchdog:
    a lower priority) and at the end of each validation epoch."""

    priority = 'LOW'

    def __init__(self) -> None:
        self.seen = []

    def _watchdog(self, runner) -> HangWatchdogHook:
        return next(h for h in runner.hooks if isinstance(h, HangWatchdogHook))

    def after_val_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        state = self._watchdog(runner).state
        self.seen.append((batch_idx, state['phase'], state['bound_s']))

    def after_val_epoch(self, runner, metrics=None) -> None:
        self.seen.append(('timed', len(self._watchdog(runner).metric_seconds)))


class TestProgress(RunnerTestCase):

    def test_the_metrics_after_the_last_validation_batch_get_their_own_bound(self):
        cfg = self.epoch_based_cfg
        cfg.custom_hooks = [dict(type='HangWatchdogHook'), dict(type='WatchdogProbeHook')]
        runner = self.build_runner(cfg)
        runner.train()
        seen = next(h for h in runner.hooks if isinstance(h, WatchdogProbeHook)).seen
        batches = len(runner.val_loop.dataloader)
        self.assertGreater(batches, 1)
        watchdog = next(h for h in runner.hooks if isinstance(h, HangWatchdogHook))
        first, second = seen[:batches + 1], seen[batches + 1:]
        # before the last batch the slow phases' bound; after it, the first metric bound
        self.assertEqual(first[0], (0, 'val', 600.0))
        self.assertEqual(first[batches - 1], (batches - 1, 'val metrics', 3600.0))
        self.assertEqual(first[batches], ('timed', 1))
        # the second validation: 10 x the first computation's time, at least 600 s
        self.assertEqual(second[batches - 1][1:], ('val metrics', 600.0))
        self.assertEqual(second[batches], ('timed', 2))
        # the waiting ranks' wait: past rank 0's bound and theirs
        self.assertEqual(watchdog.metric_wait(), 600.0 + 2 * METRIC_GRACE)

    def test_progress_after_training_and_no_stack_file_left(self):
        cfg = self.iter_based_cfg
        cfg.custom_hooks = [
            dict(type='VmRssProbeHook'),
            dict(type='HangWatchdogHook'),
            dict(type='VmRssProbeHook')
        ]
        cfg.train_cfg.max_iters = 6
        runner = self.build_runner(cfg)
        names = [type(h).__name__ for h in runner.hooks]
        at = names.index('HangWatchdogHook')
        self.assertEqual(names[at - 1:at + 2],
                         ['VmRssProbeHook', 'HangWatchdogHook', 'VmRssProbeHook'])
        runner.train()
        low, high = runner.hooks[at - 1].rss, runner.hooks[at + 1].rss
        state = read_ranks(runner.work_dir)[0]
        self.assertEqual(state['completed_iter'], 6)
        self.assertEqual(state['phase'], 'done')
        self.assertEqual(state['run'], runner.timestamp)
        self.assertEqual(state['stacks'], '')  # removed: nothing was dumped
        # the host RSS it wrote last is /proc's, read beside it (give or take 1 MiB that the
        # write itself may allocate or free)
        self.assertLessEqual(min(low, high) - 2**20, state['rss'])
        self.assertLessEqual(state['rss'], max(low, high) + 2**20)
        self.assertEqual(state['bound_s'], 600)  # last armed: around checkpoints


def _seconds(faulthandler_timeout: str) -> float:
    """faulthandler's ``Timeout (H:MM:SS.ffffff)!`` heading, in seconds."""
    hours, minutes, seconds = faulthandler_timeout.split(':')
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds)


@pytest.mark.waits
def test_a_real_hang_is_ended_with_every_stack(tmp_path):
    """The watchdog ends the run while its main thread sleeps in ``stuck_here``, after the
    bound it wrote for that iteration (the automatic one, from the iteration it timed), not
    before, and with every thread's stack. No wall-clock bound: the event is checked."""
    work = str(tmp_path / 'w')
    proc = subprocess.run([sys.executable, '-m', 'tests.helpers.toy_hang', work], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]  # faulthandler's exit
    state = read_ranks(work)[0]
    dump = parse_dump(state['stacks'])
    frames = main_frames(dump, state['main_thread'])
    where = [f'{f.func} ({osp.basename(f.file)})' for f in frames[:3]]
    # the event: it fired while the main thread was stuck, not in a healthy iteration
    assert frames[0].func == 'stuck_here' and frames[0].file.endswith('toy_hang.py'), where
    assert state['completed_iter'] == 2 and state['phase'] == 'train', state
    assert dump.timeout is not None  # the watchdog's heading, not a signal's
    # the bound in force is the documented one, from the one iteration timed so far
    expected = max(toy_hang.MIN_TIMEOUT, toy_hang.FACTOR * state['slowest_iter_s'])
    assert state['bound_s'] == pytest.approx(expected)
    assert _seconds(dump.timeout) == pytest.approx(state['bound_s'], abs=1e-5)
    # ... and it was waited for: the dump was written no sooner than the bound after arming
    dumped_at = osp.getmtime(stacks_path(work, 0))
    assert dumped_at - state['time'] >= 0.99 * state['bound_s'], (dumped_at - state['time'])
    others = [t for t in dump.threads.values() if t is not frames]
    assert any(f.func == 'idle_helper' for t in others for f in t), dump.threads  # every thread
