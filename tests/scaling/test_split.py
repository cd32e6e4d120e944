"""Tests for :mod:`mmddp_ext.scaling.split`: a global batch over devices and accumulation."""
import pytest

from mmddp_ext.scaling.split import best_split, not_divisible, small_batch_warning


@pytest.mark.parametrize(
    'global_batch, world, cap, expected',
    [
        (512, 1, 64, (64, 8)),
        (512, 2, 64, (64, 4)),
        (512, 16, 64, (32, 1)),
        (50, 1, 32, (25, 2)),  # the largest divisor within the cap: least accumulation
        (131, 1, 64, (1, 131)),  # a prime above the cap: only batch 1 divides it
        (7, 7, 64, (1, 1)),
        (10, 4, 64, None),  # 10 samples cannot be shared by 4 devices
    ])
def test_best_split(global_batch, world, cap, expected):
    split = best_split(global_batch, world, cap)
    assert split == expected
    if split is not None:
        per_device, accumulation = split
        assert per_device <= cap and per_device * accumulation * world == global_batch


def test_not_divisible_names_the_source_when_it_is_not_the_scaling_key():
    error = not_divisible(50, 4, 'auto_scale_lr.base_batch_size')
    assert str(error).startswith('the global batch 50 (from auto_scale_lr.base_batch_size) is '
                                 'not divisible by world_size 4: use 48 or 52')


def test_small_batch_warning_only_when_the_split_wastes_the_cap():
    warnings = []
    small_batch_warning(64, 1, 64, (64, 1), warnings)  # no accumulation
    small_batch_warning(128, 1, 64, (64, 2), warnings)  # the cap is full
    assert warnings == []
    small_batch_warning(131, 1, 64, (1, 131), warnings)
    assert len(warnings) == 1 and 'under half the cap 64' in warnings[0]
