"""Resuming on another split of the same global batch (pure): the factor, the refusals with
their fix, and the conversion of the iteration counter and iteration-based schedulers."""
import pytest

from mmddp_ext.scaling.config import parse_scaling
from mmddp_ext.scaling.plan import ConfigFacts, make_plan
from mmddp_ext.scaling.resume import ResumeMismatch, convert_checkpoint, resume_factor

FACTS = ConfigFacts(config_name='x_8xb32.py', batch_size=32, accumulative_counts=1,
                    auto_scale_lr_base=256, auto_scale_lr_enable=False, lrs=(0.004, ))


def _plan(world, **scaling):
    return make_plan(parse_scaling(scaling or None), FACTS, world)


@pytest.mark.parametrize('saved_world,new_world,factor', [(8, 8, 1.0), (8, 4, 2.0), (2, 8, 0.25)])
def test_factor_is_the_ratio_of_samples_per_iteration(saved_world, new_world, factor):
    saved = _plan(saved_world).to_dict()
    assert resume_factor(saved, _plan(new_world)) == factor


def test_another_global_batch_is_refused_with_the_options_that_continue():
    saved = _plan(8).to_dict()
    with pytest.raises(ResumeMismatch, match='scaling.global_batch_size=256'):
        resume_factor(saved, _plan(8, global_batch_size=128))


def test_other_learning_rates_are_refused():
    saved = _plan(8).to_dict()
    with pytest.raises(ResumeMismatch, match='learning rates'):
        resume_factor(saved, _plan(8, global_batch_size=256, base_batch_size=128))


def test_convert_moves_iterations_and_only_iteration_based_schedulers():
    ckpt = dict(
        meta=dict(iter=100), param_schedulers=[
            dict(by_epoch=False, last_step=100, begin=0, end=500),
            dict(by_epoch=True, last_step=3, milestones=[8])
        ])
    changes = convert_checkpoint(ckpt, 2.0)
    assert ckpt['meta']['iter'] == 200
    assert ckpt['param_schedulers'][0] == dict(by_epoch=False, last_step=200)
    assert ckpt['param_schedulers'][1] == dict(by_epoch=True, last_step=3, milestones=[8])
    assert changes[0] == 'iteration 100 → 200 (× 2: same samples seen)'
    assert convert_checkpoint(dict(meta=dict(iter=5)), 1.0) == []
