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
    """(the number the README says, the hook classes of its table, the table's keys)."""
    text = open(osp.join(ROOT, 'README.md')).read()
    start = text.index('- it adds ')
    count = re.match(r'- it adds (\w+) hooks', text[start:])[1]
    claim = ' '.join(text[start:text.index('\n\n', start)].split())
    assert f'a count of the runner\'s hooks is {WORDS[count]}' in claim
    table = text[text.index('| key | class |', start):]
    rows = [ln for ln in table[:table.index('\n\n')].splitlines()[2:]]
    keys = [re.match(r'\| `(\w+)` \|', row)[1] for row in rows]
    names = [re.search(r'`(\w+Hook)`', row.split('|')[2])[1] for row in rows]
    return WORDS[count], names, keys


class TestReadmeHookCount(RunnerTestCase):

    def test_ddp_runner_adds_the_hooks_the_readme_names(self):
        count, names, keys = _readme_claim()
        assert dict(zip(keys, names)) == dict(DEFAULT_HOOKS_BY_KEY, node_limits='NodeLimitsHook')
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


class TestOurDefaultHookKeys(RunnerTestCase):
    """Each hook DDPRunner adds is a ``default_hooks`` key of its own (README, "Use it in your
    configs"), with MMEngine's rules: None removes it, a dict changes its arguments."""

    def _hooks(self, name, **cfg_changes):
        cfg = copy.deepcopy(self.epoch_based_cfg)
        cfg.experiment_name = f'{self.experiment_name}_{name}'
        for key, value in cfg_changes.items():
            cfg[key] = value
        return {type(h).__name__: h for h in DDPRunner.from_cfg(cfg).hooks}

    def test_each_key_set_to_none_removes_its_hook_and_only_it(self):
        every = self._hooks('all')
        assert set(DEFAULT_HOOKS_BY_KEY.values()) <= set(every)
        for key, hook in DEFAULT_HOOKS_BY_KEY.items():
            default_hooks = dict(copy.deepcopy(self.epoch_based_cfg).get('default_hooks') or {})
            left = self._hooks(key, default_hooks=dict(default_hooks, **{key: None}))
            assert set(every) - set(left) == {hook}, key

    def test_a_dict_without_type_changes_the_arguments(self):
        hooks = self._hooks(
            'args',
            default_hooks=dict(rank_memory=dict(interval=7), finite_loss=dict(action='warn')))
        assert hooks['RankMemoryHook'].interval == 7
        assert hooks['FiniteLossHook'].action == 'warn'

    def test_removing_the_agreement_turns_off_the_check_before_wrapping_too(self):
        from mmddp_ext.runner.ddp_runner import _agreement_on
        cfg = copy.deepcopy(self.epoch_based_cfg)
        assert _agreement_on(cfg)  # positive control: on by default
        cfg.default_hooks = dict(rank_agreement=None)
        assert not _agreement_on(cfg)
        cfg.default_hooks = dict(rank_agreement=dict(enabled=False))
        assert not _agreement_on(cfg)

    def test_a_hook_listed_in_custom_hooks_is_used_instead_and_its_key_named(self):
        cfg = copy.deepcopy(self.epoch_based_cfg)
        cfg.experiment_name = self.experiment_name + '_listed'
        cfg.custom_hooks = [dict(type='PreemptionHook', signals=['SIGUSR1'])]
        runner = DDPRunner.from_cfg(cfg)
        hooks = [h for h in runner.hooks if type(h).__name__ == 'PreemptionHook']
        assert len(hooks) == 1
        with open(osp.join(runner.log_dir, f'{runner.timestamp}.log')) as f:
            log = f.read()
        assert 'custom_hooks lists PreemptionHook, one of our default hooks' in log
        assert 'default_hooks.preemption=dict(...)' in log


DEFAULT_HOOKS_BY_KEY = dict(rank_agreement='AgreementHook', scaling_plan='ScalingHook',
                            rank_memory='RankMemoryHook', finite_loss='FiniteLossHook',
                            hang_watchdog='HangWatchdogHook', preemption='PreemptionHook',
                            sync_buffers='SyncBuffersHook', global_loss='GlobalLossHook')


class TestSyncBuffersOfTheConfig(RunnerTestCase):

    def test_a_config_listing_sync_buffers_keeps_one_and_no_warning(self):
        cfg = copy.deepcopy(self.epoch_based_cfg)
        cfg.experiment_name = self.experiment_name + '_sync'
        cfg.custom_hooks = [dict(type='SyncBuffersHook')]
        runner = DDPRunner.from_cfg(cfg)
        assert [type(h).__name__ for h in runner.hooks].count('SyncBuffersHook') == 1
        with open(osp.join(runner.log_dir, f'{runner.timestamp}.log')) as f:
            assert 'custom_hooks lists' not in f.read()
