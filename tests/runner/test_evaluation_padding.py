"""``mmddp_ext.runner.evaluation``: which val/test samplers can count a padded sample
twice (table), and the warning a loop built on one gets."""
from types import SimpleNamespace

import pytest
from mmengine.logging import MMLogger
from torch.utils.data import DataLoader, SequentialSampler

from mmddp_ext.runner.evaluation import _check, padding_warning


@pytest.mark.parametrize(
    'sampler, samples, world, warned',
    [
        ('DefaultSampler', 77, 3, False),  # MMEngine's layout: collect drops the padding
        ('DistributedSampler', 77, 2, False),  # torch's: the same layout
        ('SequentialSampler', 77, 1, False),  # one rank: nothing is padded
        ('SequentialSampler', 78, 3, False),  # divisible: nothing is padded
        ('SequentialSampler', 77, 2, True),
        ('InfiniteSampler', 77, 3, True),
    ])
def test_padding_warning(sampler, samples, world, warned):
    warning = padding_warning('val', sampler, samples, world)
    assert (warning is not None) is warned
    if warned:
        padded = -(-samples // world) * world
        assert f'val_dataloader.sampler is {sampler}' in warning
        assert f'{samples} samples become {padded}' in warning
        assert "val_dataloader.sampler=dict(type='DefaultSampler', shuffle=False)" in warning


def test_a_test_loop_on_another_sampler_is_warned_once(tmp_path):
    log = tmp_path / 'run.log'
    MMLogger.get_instance('evaluation_order_test', log_file=str(log))  # the current logger
    loader = DataLoader(list(range(77)), sampler=SequentialSampler(range(77)), batch_size=4)
    _check(SimpleNamespace(dataloader=loader), 'test', 2)
    lines = [ln for ln in log.read_text().splitlines() if 'test_dataloader.sampler' in ln]
    assert len(lines) == 1 and 'WARNING' in lines[0] and 'SequentialSampler' in lines[0]
