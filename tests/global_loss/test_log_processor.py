"""``mmddp_ext.global_loss.log_processor``: the pure step that makes a log line's losses the ranks'
mean (table-tested), and the config rule that picks the processor."""
import pytest
from mmengine.runner import LogProcessor

from mmddp_ext.global_loss.log_processor import is_loss, log_processor_cfg, over_ranks

LINE_0 = dict(lr=0.01, time=0.5, loss=1.0, loss_kpt=0.5, acc_pose=0.25)


@pytest.mark.parametrize(
    'tags, expected',
    [
        # two ranks: each loss the mean, the total's min and max beside it, the rest rank 0's
        ([LINE_0, dict(loss=3.0, loss_kpt=1.5)],
         dict(lr=0.01, time=0.5, loss=2.0, loss_rank_min=1.0, loss_rank_max=3.0, loss_kpt=1.0,
              acc_pose=0.25)),
        # one rank: its own values, the spread zero
        ([LINE_0], dict(LINE_0, loss_rank_min=1.0, loss_rank_max=1.0)),
        # a loss that not every rank has stays this rank's own
        ([LINE_0, dict(loss=3.0)],
         dict(lr=0.01, time=0.5, loss=2.0, loss_rank_min=1.0, loss_rank_max=3.0, loss_kpt=0.5,
              acc_pose=0.25)),
        # with MMEngine's prefixes kept (reserve_prefix)
        ([{
            'train/loss': 2.0
        }, {
            'train/loss': 4.0
        }], {
            'train/loss': 3.0,
            'train/loss_rank_min': 2.0,
            'train/loss_rank_max': 4.0
        }),
    ])
def test_over_ranks(tags, expected):
    out = over_ranks(tags, 0)
    assert out == pytest.approx(expected)
    assert list(out)[:3] == list(expected)[:3]  # the spread follows the total loss


@pytest.mark.parametrize('key, value, loss', [('loss', 1.0, True), ('loss_cls', 2, True),
                                              ('train/loss_bbox', 0.5, True),
                                              ('loss_scale', True, False), ('lr', 0.1, False),
                                              ('loss', 'n/a', False)])
def test_is_loss(key, value, loss):
    assert is_loss(key, value) is loss


@pytest.mark.parametrize('given, expected_type', [
    (dict(window_size=50), 'GlobalLossLogProcessor'),
    (dict(type='LogProcessor', by_epoch=True), 'GlobalLossLogProcessor'),
    (dict(type=LogProcessor), 'GlobalLossLogProcessor'),
    (dict(type='MyLogProcessor'), 'MyLogProcessor'),
])
def test_the_stock_processor_is_replaced_any_other_kept(given, expected_type):
    out = log_processor_cfg(given)
    assert out['type'] == expected_type
    assert {k: v for k, v in out.items() if k != 'type'} == \
        {k: v for k, v in given.items() if k != 'type'}


def test_rows_of_ranks_that_log_other_losses_are_not_mixed():
    from mmddp_ext.global_loss.log_processor import MAX_LOSSES, losses_of, row_of
    keys = ['loss', 'loss_kpt']
    same = [row_of(keys, [1.0, 0.5]), row_of(keys, [3.0, 1.5])]
    assert len(same[0]) == len(row_of(['loss'], [2.0])) == 1 + MAX_LOSSES  # one size for all
    assert losses_of(keys, same) == [dict(loss=1.0, loss_kpt=0.5), dict(loss=3.0, loss_kpt=1.5)]
    other = [row_of(keys, [1.0, 0.5]), row_of(['loss', 'loss_cls'], [3.0, 1.5])]
    assert losses_of(keys, other) is None
    many = [f'loss_{i}' for i in range(MAX_LOSSES + 1)]
    assert losses_of(many, [row_of(many, [1.0] * len(many))] * 2) is None
