"""Tests for :mod:`mmddp_ext.scaling.plan`: batch, accumulation, LR and iteration planning."""
import json
import math
import re

import pytest

from mmddp_ext.scaling.config import ScalingConfig, parse_scaling
from mmddp_ext.scaling.plan import ConfigFacts, make_plan, name_batch, scale_iters

HRNET = 'td-hm_hrnet-w32_8xb64-210e_coco-256x192.py'
RECIPE_8XB64 = ConfigFacts(HRNET, batch_size=64, auto_scale_lr_base=512, lrs=(5e-4, 1e-3))
STORY = ConfigFacts('td-hm_res50_custom-256x192.py', batch_size=50, lrs=(1e-3, ))
STORY_SCALING = parse_scaling(dict(global_batch_size=50, base_batch_size=50))

# (world_size, per_device, accumulation, lr_scale, iter_scale) for the 8xb64 recipe.
RECIPE_TABLE = [
    (1, 64, 8, 1.0, 8.0),
    (2, 64, 4, 1.0, 4.0),
    (4, 64, 2, 1.0, 2.0),
    (8, 64, 1, 1.0, 1.0),
    (16, 32, 1, 1.0, 1.0),
]

# Every (scaling, facts, world_size, measured cap) planned somewhere below, with what follows
# from the inputs alone, worked out by hand: the global batch (samples per optimizer step), the
# base batch the LR was tuned for (None: unknown) and the samples per iteration of the config
# as written (its NxbM name's N × M, or base / (batch × accumulation) devices × batch; None:
# unknown).
ALL_CASES = [
    (ScalingConfig(), RECIPE_8XB64, ws, None, 512, 512, 8 * 64) for ws, *_ in RECIPE_TABLE
] + [
    (STORY_SCALING, STORY, 1, None, 50, 50, 50),
    (STORY_SCALING, STORY, 2, None, 50, 50, 50),
    (ScalingConfig(), STORY, 2, None, 2 * 50, None, None),  # per device: 50 on each of 2
    (ScalingConfig(lr_rule='sqrt', global_batch_size=1024), RECIPE_8XB64, 4, None, 1024, 512, 512),
    (ScalingConfig(lr_rule='none', global_batch_size=128), RECIPE_8XB64, 2, None, 128, 512, 512),
    # auto_scale_lr enabled: per device, 64 × accumulation 2 on each of 2; base 512 = 4 × 128
    (ScalingConfig(), ConfigFacts('a_8xb64.py', 64, 2, 512, True), 2, None, 64 * 2 * 2, 512, 4 * 64
     ),
    # auto_scale_lr base 16 is no whole number of 32-sample steps: set aside, so per device
    # (32 on each of 2), LR as written, and the name's 8 × 32 counts for the iterations
    (ScalingConfig(), ConfigFacts('x_8xb32-210e_y.py', 32,
                                  auto_scale_lr_base=16), 2, None, 2 * 32, None, 8 * 32),
    # base 64 = 2 devices × 32: a recipe of 64, which the base says was run on 2 × 32
    (ScalingConfig(), ConfigFacts('x_8xb32-210e_y.py', 32,
                                  auto_scale_lr_base=64), 2, None, 64, 64, 2 * 32),
    # an explicit scaling.base_batch_size means what it says, even if no split reproduces it
    (ScalingConfig(base_batch_size=16), ConfigFacts('x_8xb32-210e_y.py',
                                                    32), 2, None, 16, 16, 8 * 32),
    (ScalingConfig(max_batch_per_device=16), RECIPE_8XB64, 4, None, 512, 512, 512),
    (ScalingConfig(max_batch_per_device='auto'), RECIPE_8XB64, 4, 32, 512, 512, 512),
    (ScalingConfig(max_batch_per_device=16), RECIPE_8XB64, 2, 128, 512, 512, 512),
    (ScalingConfig(global_batch_size=3 * 131), ConfigFacts('x.py', 64), 3, None, 393, None, None),
    (ScalingConfig(global_batch_size=7), ConfigFacts('x.py', 64), 7, None, 7, None, None),
]


@pytest.mark.parametrize('world_size, per_device, accumulation, lr_scale, iter_scale', RECIPE_TABLE)
def test_8xb64_recipe_table(world_size, per_device, accumulation, lr_scale, iter_scale):
    plan = make_plan(ScalingConfig(), RECIPE_8XB64, world_size)
    assert plan.mode == 'recipe'
    assert (plan.per_device_batch_size, plan.accumulative_counts) == (per_device, accumulation)
    assert plan.global_batch_size == 512
    assert plan.lr_scale == pytest.approx(lr_scale)
    assert plan.iter_scale == pytest.approx(iter_scale)
    assert plan.reference_world_size == 8 and plan.reference_samples_per_iter == 512
    assert plan.samples_per_iter == per_device * world_size
    assert plan.lrs == pytest.approx((5e-4 * lr_scale, 1e-3 * lr_scale))
    assert plan.warnings == ()


def test_8xb64_recipe_on_3_gpus_is_not_divisible():
    with pytest.raises(ValueError) as info:
        make_plan(ScalingConfig(), RECIPE_8XB64, 3)
    msg = str(info.value)
    assert '512' in msg and 'world_size 3' in msg
    assert 'use 510 or 513' in msg
    assert '--cfg-options scaling.global_batch_size=513' in msg
    assert 'auto_scale_lr.base_batch_size' in msg


@pytest.mark.parametrize(
    'global_batch, world_size, options, nearest',
    [
        (500, 3, '498 or 501', 501),
        (10, 4, '8 or 12', 8),  # a tie goes to the smaller size
        (2, 3, '3', 3),  # nothing valid below: only the size above
    ])
def test_not_divisible_lists_nearest_sizes(global_batch, world_size, options, nearest):
    expected = (f'scaling.global_batch_size={global_batch} is not divisible by world_size '
                f'{world_size}: use {options} (--cfg-options '
                f'scaling.global_batch_size={nearest})')
    with pytest.raises(ValueError, match=re.escape(expected)):
        make_plan(
            ScalingConfig(global_batch_size=global_batch), ConfigFacts('x.py', 64), world_size)


@pytest.mark.parametrize('world_size, per_device', [(1, 50), (2, 25)])
def test_user_story_recipe_keeps_global_batch(world_size, per_device):
    plan = make_plan(STORY_SCALING, STORY, world_size)
    assert plan.mode == 'recipe'
    assert (plan.per_device_batch_size, plan.accumulative_counts) == (per_device, 1)
    assert plan.global_batch_size == 50
    assert plan.lr_scale == 1.0 and plan.lrs == (1e-3, )
    assert plan.iter_scale == 1.0
    assert plan.warnings == ()


def test_user_story_per_device_mode_doubles_global_batch():
    plan = make_plan(ScalingConfig(), STORY, 2)
    assert plan.mode == 'per_device'
    assert (plan.per_device_batch_size, plan.global_batch_size) == (50, 100)
    assert plan.lr_scale == 1.0 and plan.base_batch_size is None
    assert plan.iter_scale == 1.0
    assert any('LR kept as written' in w and 'scaling.base_batch_size' in w
               and 'auto_scale_lr.base_batch_size' in w for w in plan.warnings)
    assert any('iteration counts kept as written' in w for w in plan.warnings)


@pytest.mark.parametrize('rule, global_batch, world_size, lr_scale', [
    ('sqrt', 1024, 4, math.sqrt(2)),
    ('sqrt', 128, 2, 0.5),
    ('linear', 1024, 4, 2.0),
    ('linear', 128, 2, 0.25),
    ('none', 128, 2, 1.0),
    ('none', 1024, 4, 1.0),
])
def test_lr_rules(rule, global_batch, world_size, lr_scale):
    scaling = ScalingConfig(global_batch_size=global_batch, lr_rule=rule)
    plan = make_plan(scaling, RECIPE_8XB64, world_size)
    assert plan.lr_scale == pytest.approx(lr_scale)
    assert plan.lrs == pytest.approx((5e-4 * lr_scale, 1e-3 * lr_scale))
    assert plan.global_batch_size == global_batch


def test_per_device_mode_with_auto_scale_lr_counts_accumulation():
    facts = ConfigFacts('a_8xb64.py', 64, accumulative_counts=2, auto_scale_lr_base=512,
                        auto_scale_lr_enable=True, lrs=(0.1, ))
    plan = make_plan(ScalingConfig(), facts, 2)
    assert plan.mode == 'per_device'
    assert (plan.per_device_batch_size, plan.accumulative_counts) == (64, 2)
    assert plan.global_batch_size == 256
    assert plan.lr_scale == pytest.approx(0.5)  # 64 * 2 GPUs * 2 accumulation / 512
    assert plan.lrs == pytest.approx((0.05, ))
    assert plan.reference_world_size == 4  # 512 / (64 * 2 accumulation)
    assert plan.iter_scale == pytest.approx(2.0)


def test_auto_scale_lr_disabled_base_gives_recipe_mode():
    facts = ConfigFacts('a_8xb64.py', 64, auto_scale_lr_base=512, auto_scale_lr_enable=False)
    assert make_plan(ScalingConfig(), facts, 2).mode == 'recipe'
    scaling = ScalingConfig(global_batch_size=256)
    enabled = ConfigFacts('a_8xb64.py', 64, auto_scale_lr_base=512, auto_scale_lr_enable=True)
    assert make_plan(scaling, enabled, 2).mode == 'recipe'


@pytest.mark.parametrize(
    'base_in_scaling, source, base',
    [
        # an auto_scale_lr base must be a whole number of per-device steps (32) to be used
        (False, 'auto_scale_lr.base_batch_size', 64),
        (True, 'scaling.base_batch_size', 16),
    ])
def test_name_mismatch_warning(base_in_scaling, source, base):
    if base_in_scaling:
        facts = ConfigFacts('x_8xb32-210e_y.py', 32)
        scaling = ScalingConfig(base_batch_size=base)
    else:
        facts = ConfigFacts('x_8xb32-210e_y.py', 32, auto_scale_lr_base=base)
        scaling = ScalingConfig()
    plan = make_plan(scaling, facts, 2)
    expected = (f'config name says 8xb32 = 256 samples per step, but the reference batch '
                f'({source}) is {base}: the LR scale uses {base}; set '
                f'scaling.base_batch_size=256 if the name is right')
    assert expected in plan.warnings
    assert plan.global_batch_size == base


def test_no_name_warning_when_name_agrees():
    plan = make_plan(ScalingConfig(), RECIPE_8XB64, 2)
    assert not any('config name says' in w for w in plan.warnings)


@pytest.mark.parametrize(
    'scaling, world_size, measured, per_device, accumulation',
    [
        (ScalingConfig(max_batch_per_device=16), 4, None, 16, 8),
        (ScalingConfig(max_batch_per_device=16), 2, 128, 128, 2),  # measured cap wins
        (ScalingConfig(max_batch_per_device='auto'), 4, 32, 32, 4),
        (ScalingConfig(max_batch_per_device='auto'), 4, None, 64, 2),  # 'auto' unmeasured
        (ScalingConfig(), 1, None, 64, 8),  # cap = config's batch
    ])
def test_cap(scaling, world_size, measured, per_device, accumulation):
    plan = make_plan(scaling, RECIPE_8XB64, world_size, max_batch_per_device=measured)
    assert (plan.per_device_batch_size, plan.accumulative_counts) == (per_device, accumulation)
    assert plan.global_batch_size == 512
    assert plan.iter_scale == pytest.approx(512 / (per_device * world_size))


def test_small_per_device_batch_warning():
    plan = make_plan(ScalingConfig(global_batch_size=3 * 131), ConfigFacts('x.py', 64), 3)
    assert (plan.per_device_batch_size, plan.accumulative_counts) == (1, 131)
    warning = next(w for w in plan.warnings if 'under half the cap' in w)
    assert 'per-device batch 1 × accumulation 131' in warning
    assert '387 (per-device 43 × accumulation 3)' in warning
    assert '396 (per-device 44 × accumulation 3)' in warning
    assert '--cfg-options scaling.global_batch_size=396' in warning


def test_no_small_batch_warning_without_accumulation():
    plan = make_plan(ScalingConfig(global_batch_size=7), ConfigFacts('x.py', 64), 7)
    assert plan.per_device_batch_size == 1 and plan.accumulative_counts == 1
    assert not any('under half the cap' in w for w in plan.warnings)


@pytest.mark.parametrize(
    'cap, world, split, global_batch',
    [
        (32, 1, (25, 2), 50),  # 50 = 25 × 2: the largest divisor of 50 within the cap
        (32, 2, (25, 2), 100),  # per device: the global batch follows the world size as always
        (50, 2, (50, 1), 100),  # at the cap: unchanged
        (7, 1, (5, 10), 50),
    ])
def test_per_device_mode_splits_above_the_cap(cap, world, split, global_batch):
    plan = make_plan(ScalingConfig(max_batch_per_device=cap), STORY, world)
    assert plan.mode == 'per_device'
    assert (plan.per_device_batch_size, plan.accumulative_counts) == split
    assert plan.global_batch_size == global_batch
    assert plan.lr_scale == 1.0  # same samples per step as written


def test_per_device_split_uses_a_measured_cap_and_warns_when_far_below_it():
    plan = make_plan(ScalingConfig(max_batch_per_device='auto'), STORY, 1, max_batch_per_device=24)
    assert (plan.per_device_batch_size, plan.accumulative_counts) == (10, 5)
    assert any('split as per-device batch 10 × accumulation 5' in w and 'cap 24' in w
               for w in plan.warnings)


@pytest.mark.parametrize('value, iter_scale, expected', [
    (0, 8.0, 0),
    (0, 0.1, 0),
    (1, 0.1, 1),
    (250, 1.5, 375),
    (5, 0.5, 3),
    (7, 0.5, 4),
    (500, 8.0, 4000),
    (3, 1 / 3, 1),
    (210, 1.0, 210),
])
def test_scale_iters(value, iter_scale, expected):
    assert scale_iters(value, iter_scale) == expected


@pytest.mark.parametrize('value, iter_scale', [(-1, 1.0), (2.5, 1.0), (True, 1.0), (10, 0.0),
                                               (10, -1.0), (10, float('inf'))])
def test_scale_iters_rejects_bad_input(value, iter_scale):
    with pytest.raises(ValueError, match=r'must be a'):
        scale_iters(value, iter_scale)


@pytest.mark.parametrize('name, expected', [
    (HRNET, (8, 64)),
    ('x_8xb32-210e_y.py', (8, 32)),
    ('configs/body_2d/rtmpose-m_8xb256-420e_coco-256x192.py', (8, 256)),
    ('td-hm_res18_1xb32-30e_demo-64x64.py', (1, 32)),
    ('model_4xb16.py', (4, 16)),
    ('16xb2_model.py', (16, 2)),
    ('td-hm_hrnet-w32_coco-256x192.py', None),
    ('x_8xb64x-210e.py', None),
    ('x8xb64_y.py', None),
    ('x_0xb64_y.py', None),
    ('', None),
])
def test_name_batch(name, expected):
    assert name_batch(name) == expected


def test_describe_exact():
    facts = ConfigFacts('x.py', 64, auto_scale_lr_base=512)
    plan = make_plan(ScalingConfig(max_batch_per_device=64), facts, 2)
    assert plan.accumulative_counts == 4
    assert plan.describe() == ('per-GPU batch 64 × 2 GPUs × accumulation 4 = global 512 '
                               '(the config was tuned for 512) → LR × 1.0')


@pytest.mark.parametrize('scaling, world_size, text', [
    (ScalingConfig(global_batch_size=32), 1, 'accumulation 1 = global 32 (the config was '
     'tuned for 512) → LR × 0.0625'),
    (ScalingConfig(global_batch_size=1024, lr_rule='sqrt'), 4, '→ LR × 1.414'),
    (ScalingConfig(global_batch_size=2048), 8, 'per-GPU batch 64 × 8 GPUs × accumulation 4'),
    (ScalingConfig(global_batch_size=64), 1, 'per-GPU batch 64 × 1 GPU × accumulation 1'),
])
def test_describe_formats(scaling, world_size, text):
    assert text in make_plan(scaling, RECIPE_8XB64, world_size).describe()


def test_describe_without_base():
    plan = make_plan(ScalingConfig(), STORY, 2)
    assert plan.describe() == ('per-GPU batch 50 × 2 GPUs × accumulation 1 = global 100 '
                               '(no base batch size known) → LR × 1.0')


def test_to_dict_is_json_ready():
    plan = make_plan(ScalingConfig(), RECIPE_8XB64, 2)
    data = plan.to_dict()
    assert isinstance(data['lrs'], list) and isinstance(data['warnings'], list)
    assert json.loads(json.dumps(data)) == data
    assert data['accumulative_counts'] == 4 and data['mode'] == 'recipe'


def test_keep_iters_schedule():
    plan = make_plan(ScalingConfig(schedule='keep_iters'), RECIPE_8XB64, 1)
    assert plan.accumulative_counts == 8
    assert plan.iter_scale == 1.0


def test_recipe_without_reference_assumes_one_device():
    plan = make_plan(ScalingConfig(global_batch_size=128), ConfigFacts('x.py', 64), 2)
    assert plan.reference_world_size == 1
    assert plan.iter_scale == pytest.approx(0.5)
    assert any('written for 1 device' in w for w in plan.warnings)


def _rule(rule, ratio):
    return {'linear': ratio, 'sqrt': math.sqrt(ratio), 'none': 1.0}[rule]


@pytest.mark.parametrize('scaling, facts, world_size, measured, global_batch, base, written',
                         ALL_CASES)
def test_invariants(scaling, facts, world_size, measured, global_batch, base, written):
    plan = make_plan(scaling, facts, world_size, max_batch_per_device=measured)
    assert plan.global_batch_size == global_batch == (
        plan.per_device_batch_size * world_size * plan.accumulative_counts)
    assert plan.world_size == world_size
    assert plan.samples_per_iter == plan.per_device_batch_size * world_size
    assert plan.base_batch_size == base
    if scaling.global_batch_size is not None or (base is not None
                                                 and not facts.auto_scale_lr_enable):
        assert plan.mode == 'recipe'
        cap = measured or (scaling.max_batch_per_device
                           if isinstance(scaling.max_batch_per_device, int) else facts.batch_size)
        assert plan.per_device_batch_size <= cap
    else:  # the config's samples per device per step are kept
        assert plan.mode == 'per_device'
        assert plan.per_device_batch_size * plan.accumulative_counts == (
            facts.batch_size * facts.accumulative_counts)
    # the LR follows the rule on global / base (× 1.0 when the base is unknown)
    lr_scale = 1.0 if base is None else _rule(scaling.lr_rule, global_batch / base)
    assert plan.lr_scale == pytest.approx(lr_scale)
    assert plan.lrs == pytest.approx(tuple(lr * lr_scale for lr in facts.lrs))
    # iteration counts keep the samples seen: iterations × samples per iteration as written
    if plan.schedule == 'keep_samples' and written is not None:
        assert plan.iter_scale * plan.per_device_batch_size * world_size == \
            pytest.approx(written)
    elif plan.schedule == 'keep_samples' and plan.mode == 'recipe':
        # unknown: assumed written for 1 device (and said so)
        assert plan.iter_scale * plan.per_device_batch_size * world_size == \
            pytest.approx(facts.batch_size)
        assert any('written for 1 device' in w for w in plan.warnings)
    else:
        assert plan.iter_scale == 1.0


@pytest.mark.parametrize('world_size', [0, -1, '2', 2.0, True, None])
def test_bad_world_size(world_size):
    with pytest.raises(ValueError, match=re.escape(f'world_size={world_size!r}')):
        make_plan(ScalingConfig(), RECIPE_8XB64, world_size)


@pytest.mark.parametrize('measured', [0, '32', 2.5])
def test_bad_measured_cap(measured):
    with pytest.raises(ValueError, match=re.escape(f'max_batch_per_device={measured!r}')):
        make_plan(ScalingConfig(), RECIPE_8XB64, 2, max_batch_per_device=measured)


@pytest.mark.parametrize('kwargs, key', [
    (dict(batch_size=0), 'train_dataloader.batch_size=0'),
    (dict(batch_size=None), 'train_dataloader.batch_size=None'),
    (dict(batch_size=64, accumulative_counts=0), 'optim_wrapper.accumulative_counts=0'),
    (dict(batch_size=64, auto_scale_lr_base=2.5), 'auto_scale_lr.base_batch_size=2.5'),
])
def test_bad_facts(kwargs, key):
    with pytest.raises(ValueError, match=re.escape(key)):
        ConfigFacts('x.py', **kwargs)


def test_unmeasured_auto_cap_is_said_and_measured_cap_is_used():
    scaling = ScalingConfig(global_batch_size=64, max_batch_per_device='auto')
    guess = make_plan(scaling, STORY, 2)
    assert (guess.per_device_batch_size, guess.accumulative_counts) == (32, 1)
    assert any("'auto' is measured when training starts" in w for w in guess.warnings)
    measured = make_plan(scaling, STORY, 2, max_batch_per_device=12)
    assert (measured.per_device_batch_size, measured.accumulative_counts) == (8, 4)
    assert measured.global_batch_size == 64 and measured.lr_scale == guess.lr_scale
    assert not any("'auto'" in w for w in measured.warnings)
