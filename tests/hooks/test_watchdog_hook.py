"""HangWatchdogHook: the bound, the progress file on MMEngine's toy runner, and a real hang
ended by the interpreter's own watchdog with every thread's stack written."""
import os.path as osp
import subprocess
import sys

import pytest
from mmengine.testing import RunnerTestCase

from mmddp_ext.hooks import HangWatchdogHook
from mmddp_ext.hooks.watchdog_hook import watchdog_bound
from mmddp_ext.progress import read_ranks
from mmddp_ext.stacks import main_frames, parse_dump

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


@pytest.mark.parametrize('kwargs,name', [(dict(timeout=0), 'timeout=0'),
                                         (dict(factor=-1), 'factor=-1'),
                                         (dict(window=True), 'window=True')])
def test_bad_arguments_name_the_value(kwargs, name):
    with pytest.raises(ValueError, match=name):
        HangWatchdogHook(**kwargs)


class TestProgress(RunnerTestCase):

    def test_progress_after_training_and_no_stack_file_left(self):
        cfg = self.iter_based_cfg
        cfg.custom_hooks = [dict(type='HangWatchdogHook')]
        cfg.train_cfg.max_iters = 6
        runner = self.build_runner(cfg)
        runner.train()
        state = read_ranks(runner.work_dir)[0]
        self.assertEqual(state['completed_iter'], 6)
        self.assertEqual(state['phase'], 'done')
        self.assertEqual(state['run'], runner.timestamp)
        self.assertEqual(state['stacks'], '')  # removed: nothing was dumped
        self.assertGreater(state['rss'], 0)
        self.assertEqual(state['bound_s'], 600)  # last armed: around checkpoints


def test_a_real_hang_is_ended_with_every_stack(tmp_path):
    work = str(tmp_path / 'w')
    proc = subprocess.run([sys.executable, '-m', 'tests.helpers.toy_hang', work], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]  # faulthandler's exit
    state = read_ranks(work)[0]
    assert state['completed_iter'] == 2 and state['phase'] == 'train'
    dump = parse_dump(state['stacks'])
    assert dump.timeout is not None  # the watchdog's heading
    frames = main_frames(dump, state['main_thread'])
    assert frames[0].func == 'stuck_here' and frames[0].file.endswith('toy_hang.py')
