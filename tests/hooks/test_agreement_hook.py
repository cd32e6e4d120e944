"""AgreementHook in-process on MMEngine's toy runner (one process: it must agree with itself,
log its line and time itself), and what it summarises. The real 2-process mismatches are
``tests/e2e/test_agreement.py``."""
import copy
from unittest import mock

import pytest
from mmengine.testing import RunnerTestCase

from mmddp_ext.agreement.collective import agree_or_stop, parameter_shapes, versions, view_of
from mmddp_ext.agreement.compare import PACKAGES, RanksDisagreeError
from mmddp_ext.hooks.agreement_hook import AgreementHook
from mmddp_ext.runner.ddp_runner import DDPRunner


class TestAgreementHook(RunnerTestCase):

    def _runner(self):
        cfg = copy.deepcopy(self.epoch_based_cfg)
        cfg.train_cfg = dict(by_epoch=True, max_epochs=1, val_interval=10)
        cfg.experiment_name = self.experiment_name
        return DDPRunner.from_cfg(cfg)

    def test_added_by_default_agrees_and_times_itself(self):
        runner = self._runner()
        [hook] = [h for h in runner.hooks if isinstance(h, AgreementHook)]
        runner.train()
        assert len(hook.summaries) == 1
        mine = hook.summaries[0]
        assert mine['dataset length'] == len(runner.train_dataloader.dataset)
        assert mine['iterations per epoch'] == len(runner.train_dataloader)
        n = len(list(runner.model.parameters()))
        assert mine['parameters'].startswith(f'{n} tensors, ')
        assert hook.seconds > 0  # its cost is measured in bench/hook_costs.py

    def test_switched_off_it_gathers_nothing_here_or_at_wrap_time(self):
        from mmddp_ext.runner.ddp_runner import _agreement_on
        cfg = copy.deepcopy(self.epoch_based_cfg)
        cfg.train_cfg = dict(by_epoch=True, max_epochs=1, val_interval=10)
        cfg.experiment_name = self.experiment_name + '_off'
        cfg.custom_hooks = [dict(type='AgreementHook', enabled=False)]
        runner = DDPRunner.from_cfg(cfg)
        [hook] = [h for h in runner.hooks if isinstance(h, AgreementHook)]
        runner.train()
        assert hook.summaries == [] and hook.seconds is None
        assert not _agreement_on(runner.cfg) and _agreement_on(self._runner().cfg)

    def test_view_excludes_the_work_dir(self):
        runner = self._runner()
        a, _ = view_of(runner.model, runner.cfg)
        cfg = copy.deepcopy(runner.cfg)
        cfg.work_dir = '/elsewhere'
        b, _ = view_of(runner.model, cfg)
        cfg.train_cfg.max_epochs = 7
        c, _ = view_of(runner.model, cfg)
        assert a['config'] == b['config'] != c['config']


@pytest.mark.parametrize('bad', [0, 'no', None])
def test_enabled_must_be_a_bool(bad):
    with pytest.raises(ValueError, match=f'enabled={bad!r}'):
        AgreementHook(enabled=bad)


def test_versions_and_shapes():
    from importlib import metadata

    import torch
    got = versions()
    assert set(got) == set(PACKAGES) and got['torch'] == metadata.version('torch')
    assert versions(('no-such-package-xyz', ))['no-such-package-xyz'] is None
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    assert parameter_shapes(model) == [('0.weight', (2, 3)), ('0.bias', (2, ))]


def test_agree_or_stop_raises_on_every_rank_with_the_screen_on_rank_0():
    """The collective faked by its result: two ranks' summaries, rank 1's dataset shorter."""
    mine = dict(host='a', **{'dataset length': 64})
    other = dict(host='b', **{'dataset length': 16})
    collective = 'mmddp_ext.agreement.collective'
    with mock.patch(f'{collective}.all_gather_object', return_value=[mine, other]), \
            mock.patch(f'{collective}.barrier') as barrier:
        with pytest.raises(RanksDisagreeError, match='  dataset length:') as rank0:
            agree_or_stop(mine, [], rank=0)
        with pytest.raises(RanksDisagreeError, match="table is in rank 0's log") as rank1:
            agree_or_stop(other, [], rank=1)
    assert barrier.call_count == 2  # nobody leaves before rank 0 has shown the screen
    assert rank0.value.ranks == rank1.value.ranks == [1]
    assert rank0.value.fields == ['dataset length']
