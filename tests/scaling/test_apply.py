"""Applying a plan to real installed MMPose / MMDetection configs, and the resume reconciler."""
import copy

import pytest

from mmddp_ext.errors import ScalingError
from mmddp_ext.scaling import ScalingConfig, make_plan
from mmddp_ext.scaling.apply import apply_plan, plan_for_config, read_facts
from mmddp_ext.scaling.resume import ResumeMismatch, convert_checkpoint, resume_factor
from mmddp_ext.utils.config import load_config

from conftest import recipe_expectation, written_recipe

POSE = 'mmpose::body_2d_keypoint/topdown_heatmap/coco/td-hm_hrnet-w32_8xb64-210e_coco-256x192.py'
DET = 'mmdet::faster_rcnn/faster-rcnn_r50-caffe_fpn_ms-90k_coco.py'


@pytest.fixture(scope='module')
def pose_cfg():
    return load_config(POSE)


@pytest.fixture(scope='module')
def det_cfg():
    return load_config(DET)


def test_read_facts_from_a_real_config(pose_cfg):
    facts = read_facts(pose_cfg)
    assert (facts.batch_size, facts.auto_scale_lr_base, facts.lrs) == (64, 512, (5e-4, ))
    assert facts.config_name == 'td-hm_hrnet-w32_8xb64-210e_coco-256x192.py'


def test_the_worked_example_of_the_docs(pose_cfg, det_cfg):
    """docs/scaling.md's numbers, from the product (the other tests here compare it with the
    rules of ``conftest.recipe_expectation``, and this one ties both to the docs): HRNet 8xb64
    on 1 GPU is 64 × accumulation 8 and its 500-iteration warm-up becomes 4000
    micro-iterations; on 16 GPUs 32 each; Faster R-CNN (16 images per step) on 16 GPUs is 1
    per device, iterations as written."""
    one = plan_for_config(copy.deepcopy(pose_cfg), 1)
    assert (one.per_device_batch_size, one.accumulative_counts) == (64, 8)
    assert round(500 * one.iter_scale) == 4000
    assert plan_for_config(copy.deepcopy(pose_cfg), 16).per_device_batch_size == 32
    det = plan_for_config(copy.deepcopy(det_cfg), 16)
    assert (det.per_device_batch_size, det.iter_scale) == (1, 1.0)
    for world in (1, 16):  # and the rules the other tests use agree
        assert recipe_expectation(POSE, world)['per_device_batch_size'] == plan_for_config(
            copy.deepcopy(pose_cfg), world).per_device_batch_size


@pytest.mark.parametrize('world', [1, 2, 8, 16])
def test_pose_recipe_on_any_world_size(pose_cfg, world):
    written = copy.deepcopy(pose_cfg)
    expect = recipe_expectation(POSE, world)
    cfg = copy.deepcopy(pose_cfg)
    plan = plan_for_config(cfg, world)
    apply_plan(cfg, plan)
    per_device, accum = expect['per_device_batch_size'], expect['accumulative_counts']
    assert cfg.train_dataloader.batch_size == per_device
    assert cfg.optim_wrapper.get('accumulative_counts', 1) == accum
    assert per_device * world * accum == 512  # 8xb64
    assert cfg.optim_wrapper.optimizer.lr == pytest.approx(written.optim_wrapper.optimizer.lr *
                                                           expect['lr_scale'])
    assert expect['lr_scale'] == 1.0  # 512 kept: LR as written
    (warmup, multistep), (warmup0, multistep0) = cfg.param_scheduler, written.param_scheduler
    assert warmup0.by_epoch is False and multistep0.by_epoch is True
    # by_epoch=False: scaled so that it ends after the same number of samples
    assert warmup.end == round(warmup0.end * expect['iter_scale'])
    assert warmup.end * per_device * world == warmup0.end * 512
    assert multistep.milestones == multistep0.milestones  # by epoch: unchanged
    assert cfg.train_cfg.max_epochs == written.train_cfg.max_epochs


@pytest.mark.parametrize('world', [1, 2, 8, 16])
def test_det_iteration_based_schedule_keeps_samples(det_cfg, world):
    written = copy.deepcopy(det_cfg)
    expect = recipe_expectation(DET, world)
    scale = expect['iter_scale']
    cfg = copy.deepcopy(det_cfg)
    plan = plan_for_config(cfg, world)
    changes = apply_plan(cfg, plan)
    per_device = expect['per_device_batch_size']
    assert (cfg.train_dataloader.batch_size,
            plan.accumulative_counts) == (per_device, expect['accumulative_counts'])
    assert cfg.train_cfg.max_iters == round(written.train_cfg.max_iters * scale)
    assert cfg.train_cfg.val_interval == round(written.train_cfg.val_interval * scale)
    assert cfg.param_scheduler[1].milestones == [
        round(m * scale) for m in written.param_scheduler[1].milestones
    ]
    assert written.default_hooks.checkpoint.by_epoch is False
    assert cfg.default_hooks.checkpoint.interval == round(
        written.default_hooks.checkpoint.interval * scale)
    # samples seen are the same on every world size: those of 90k iterations at 16
    base = written_recipe(DET)['base']
    assert cfg.train_cfg.max_iters * per_device * world == written.train_cfg.max_iters * base
    assert all('→' in c for c in changes)
    assert any(c.startswith('train_cfg.max_iters') for c in changes) == (scale != 1.0)


def test_auto_scale_lr_is_not_applied_twice(pose_cfg):
    cfg = copy.deepcopy(pose_cfg)
    cfg.auto_scale_lr.enable = True  # per-device mode: MMEngine semantics plus accumulation
    cfg.optim_wrapper.accumulative_counts = 2
    plan = plan_for_config(cfg, 2)
    apply_plan(cfg, plan)
    assert plan.mode == 'per_device' and plan.global_batch_size == 64 * 2 * 2
    assert cfg.optim_wrapper.optimizer.lr == pytest.approx(5e-4 * 256 / 512)
    assert cfg.auto_scale_lr.enable is False  # MMEngine's scale_lr will not run again


def test_bad_scaling_block_is_a_user_error(pose_cfg):
    cfg = copy.deepcopy(pose_cfg)
    cfg.scaling = dict(global_batch=512)
    with pytest.raises(ScalingError, match="did you mean 'global_batch_size'"):
        plan_for_config(cfg, 2)
    cfg.scaling = dict(global_batch_size=512)
    with pytest.raises(ScalingError, match='510 or 513'):
        plan_for_config(cfg, 3)


def _plan(world, cap=16):
    from mmddp_ext.scaling import ConfigFacts
    return make_plan(
        ScalingConfig(global_batch_size=32, max_batch_per_device=cap),
        ConfigFacts('x_1xb32-30e.py', 32, auto_scale_lr_base=32, lrs=(1e-3, )), world)


def test_resume_factor_and_checkpoint_conversion():
    saved, now = _plan(2).to_dict(), _plan(1)
    assert (now.per_device_batch_size, now.accumulative_counts) == (16, 2)
    factor = resume_factor(saved, now)
    assert factor == 2.0
    ckpt = dict(
        meta=dict(iter=4, epoch=2), param_schedulers=[
            dict(by_epoch=False, begin=0, end=50, last_step=4, start_factor=0.01),
            dict(by_epoch=True, begin=0, end=30, milestones={22: 1}, last_step=2)
        ])
    changes = convert_checkpoint(ckpt, factor)
    assert ckpt['meta']['iter'] == 8
    warmup, multistep = ckpt['param_schedulers']
    assert warmup['last_step'] == 8 and 'end' not in warmup and 'begin' not in warmup
    assert multistep == dict(by_epoch=True, begin=0, end=30, milestones={22: 1}, last_step=2)
    assert changes and 'iteration 4 → 8' in changes[0]
    assert convert_checkpoint(ckpt, 1.0) == [] and ckpt['meta']['iter'] == 8


def test_resume_with_another_global_batch_is_refused():
    saved = _plan(2).to_dict()
    saved['global_batch_size'] = 64
    with pytest.raises(ResumeMismatch, match='scaling.global_batch_size=64'):
        resume_factor(saved, _plan(1))
    saved = _plan(2).to_dict()
    saved['lrs'] = [2e-3]
    with pytest.raises(ResumeMismatch, match='learning rates'):
        resume_factor(saved, _plan(1))


def test_rtmdet_name_and_base_disagree_both_facts_in_the_warning():
    """rtmdet_tiny_8xb32: the name means 8 × 32 = 256 per step, auto_scale_lr says 16, which
    is not a whole number of per-device steps of 32: the one warning names both numbers and
    both fixes (the name's 256 was lost once, when the per-device fallback came in)."""
    cfg = load_config('mmdet::rtmdet/rtmdet_tiny_8xb32-300e_coco.py')
    written = written_recipe('mmdet::rtmdet/rtmdet_tiny_8xb32-300e_coco.py')
    assert (written['global_batch'], written['base'], written['batch']) == (256, 16, 32)
    plan = plan_for_config(cfg, 8)
    [warning] = [w for w in plan.warnings if 'base_batch_size=16' in w]
    assert 'not a whole number of per-device steps' in warning
    assert '8xb32 = 256 samples per step' in warning
    assert 'scaling.global_batch_size=256' in warning and 'scaling.global_batch_size=16' in warning
    assert plan.mode == 'per_device' and plan.per_device_batch_size == 32


def _demo_with_schedulers(schedule=None):
    """The demo config (1xb32) with one iteration-based scheduler of each kind that has an
    iteration key, and an epoch-based one that must stay as written."""
    from conftest import DEMO_CONFIG
    cfg = load_config(DEMO_CONFIG)
    cfg.param_scheduler = [
        dict(type='LinearLR', by_epoch=False, begin=0, end=100),
        dict(type='CosineAnnealingLR', by_epoch=False, begin=100, end=1100, T_max=1000),
        dict(type='StepLR', by_epoch=False, step_size=300),
        dict(type='OneCycleLR', by_epoch=False, eta_max=0.1, total_steps=1200),
        dict(type='CosineRestartLR', by_epoch=False, periods=[400, 800], restart_weights=[1, 1]),
        dict(type='MultiStepLR', by_epoch=False, milestones=[600, 900]),
        dict(type='MultiStepLR', by_epoch=True, milestones=[20, 25]),
    ]
    cfg.scaling = dict(global_batch_size=32, max_batch_per_device=8)
    if schedule:
        cfg.scaling['schedule'] = schedule
    return cfg


def test_every_iteration_key_of_every_scheduler_keeps_the_samples_seen():
    """One process, at most 8 per device: 8 × accumulation 4, so 4 micro-iterations per
    written iteration. Each key is compared with the written value times the samples per
    written iteration over the samples per micro-iteration (32 / 8), worked out here."""
    cfg = _demo_with_schedulers()
    plan = plan_for_config(cfg, 1)
    assert (plan.per_device_batch_size, plan.accumulative_counts) == (8, 4)
    changes = apply_plan(cfg, plan)
    s = cfg.param_scheduler
    assert (s[0].begin, s[0].end) == (0, 400)
    assert (s[1].begin, s[1].end, s[1].T_max) == (400, 4400, 4000)
    assert s[2].step_size == 1200
    assert s[3].total_steps == 4800
    assert s[4].periods == [1600, 3200] and s[4].restart_weights == [1, 1]
    assert s[5].milestones == [2400, 3600]
    assert s[6].milestones == [20, 25]  # by epoch: as written
    assert 'param_scheduler[1].T_max: 1000 → 4000' in changes
    assert not any(c.startswith('param_scheduler[6]') for c in changes)


def test_keep_iters_leaves_every_iteration_key_as_written():
    written = _demo_with_schedulers()
    cfg = _demo_with_schedulers('keep_iters')
    plan = plan_for_config(cfg, 1)
    assert plan.accumulative_counts == 4 and plan.iter_scale == 1.0
    changes = apply_plan(cfg, plan)
    assert [dict(s) for s in cfg.param_scheduler] == [dict(s) for s in written.param_scheduler]
    assert not any(c.startswith('param_scheduler') for c in changes)
