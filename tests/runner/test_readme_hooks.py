"""The README's count of the hooks DDPRunner adds, and their names, against a real DDPRunner
and a stock Runner built from the same config (MMEngine's toy runner, in-process)."""
import copy
import os.path as osp
import re

from mmengine.runner import Runner
from mmengine.testing import RunnerTestCase

from mmddp_ext.runner.ddp_runner import DDPRunner

from conftest import ROOT

WORDS = dict(one=1, two=2, three=3, four=4, five=5, six=6, seven=7, eight=8, nine=9, ten=10)


def _readme_claim():
    """(the number the README says, the hook names its bullet lists)."""
    text = open(osp.join(ROOT, 'README.md')).read()
    start = text.index('- it adds ')
    bullet = text[start:text.index('\n- ', start + 1)]
    count = re.match(r'- it adds (\w+) hooks', bullet)[1]
    assert f'a count of the runner\'s hooks is {WORDS[count]}' in ' '.join(bullet.split())
    return WORDS[count], re.findall(r'`(\w+Hook)`', bullet)


class TestReadmeHookCount(RunnerTestCase):

    def test_ddp_runner_adds_the_hooks_the_readme_names(self):
        count, names = _readme_claim()
        cfg = copy.deepcopy(self.epoch_based_cfg)
        cfg.experiment_name = self.experiment_name + '_stock'
        stock = [type(h).__name__ for h in Runner.from_cfg(cfg).hooks]
        cfg = copy.deepcopy(self.epoch_based_cfg)
        cfg.experiment_name = self.experiment_name + '_ddp'
        ours = [type(h).__name__ for h in DDPRunner.from_cfg(cfg).hooks]
        assert len(ours) - len(stock) == count == len(names)
        # and the checkpoint hook is MMEngine's subclass that refuses non-finite weights
        assert sorted(set(ours) - set(stock)) == sorted(names + ['FiniteCheckpointHook'])
        assert set(stock) - set(ours) == {'CheckpointHook'}

    def test_a_hook_the_config_lists_is_not_added_twice(self):
        cfg = copy.deepcopy(self.epoch_based_cfg)
        cfg.experiment_name = self.experiment_name
        cfg.custom_hooks = [dict(type='RankMemoryHook', interval=7)]
        hooks = [h for h in DDPRunner.from_cfg(cfg).hooks if type(h).__name__ == 'RankMemoryHook']
        assert len(hooks) == 1 and hooks[0].interval == 7
