"""``--explain`` refuses what training refuses, with the same one-line error and exit 1
(in-process: ``mmddp_ext.entry.train.main``, as ``tools/dist_train.py`` calls it)."""
import pytest

from mmddp_ext.entry.train import main

from conftest import DEMO_CONFIG


@pytest.mark.parametrize('options, message', [
    (['runner_type=DDPRuner'], "runner_type='DDPRuner' is not a registered runner (did you mean "
     "'DDPRunner'?)"),
    (['runner_type=Runner'], "the config sets `scaling` but runner_type is 'Runner', which "
     "ignores it"),
    (['scaling.max_batch_per_device=auto'], "scaling.max_batch_per_device='auto' on a CPU "
     "needs a memory budget"),
])
def test_explain_rejects_what_training_rejects(capsys, options, message):
    if 'scaling' not in ' '.join(options):
        options = options + ['scaling.lr_rule=linear']  # a scaling block the runner must honour
    code = main([DEMO_CONFIG, '--explain', '--cfg-options', *options])
    err = capsys.readouterr().err
    assert code == 1
    assert message in err and err.startswith('[mmddp_ext] error: ')


def test_explain_accepts_a_registered_subclass_of_ddprunner(capsys):
    from mmengine.registry import RUNNERS

    from mmddp_ext.runner import DDPRunner

    @RUNNERS.register_module(force=True)
    class MyPlanningRunner(DDPRunner):
        pass

    code = main([
        DEMO_CONFIG, '--explain', '--world-size', '2', '--cfg-options',
        'runner_type=MyPlanningRunner', 'scaling.lr_rule=linear'
    ])
    out = capsys.readouterr().out
    assert code == 0
    assert 'plan            per-GPU batch 16 × 2 GPUs × accumulation 1 = global 32' in out
    assert 'runner_type' not in out
