"""``mmddp_ext.runner.teardown`` on MMEngine's own test runner: only built loops are reached
(none is built by the teardown), and their loaders are let go."""
from mmengine.runner import BaseLoop, Runner
from mmengine.testing import RunnerTestCase

from mmddp_ext.runner.teardown import built_loops, let_go_of_loaders


def _runner(tmp_path, cfg_name: str, build_train_loop: bool = False) -> Runner:
    case = RunnerTestCase()
    case.setUp()
    try:  # the test case's toy modules are registered until tearDown
        cfg = getattr(case, cfg_name)
        cfg.work_dir, cfg.experiment_name = str(tmp_path), f'teardown_{cfg_name}'
        runner = Runner.from_cfg(cfg)
        if build_train_loop:  # its loader and MMEngine's infinite iterator over it
            runner.train_loop
        return runner
    finally:
        case.tearDown()


def test_no_loop_is_built_by_the_teardown(tmp_path):
    runner = _runner(tmp_path, 'epoch_based_cfg')
    assert list(built_loops(runner)) == []
    let_go_of_loaders(runner)
    assert not isinstance(runner._val_loop, BaseLoop)  # still the config: nothing was built


def test_built_loops_let_go_of_their_loaders(tmp_path):
    runner = _runner(tmp_path, 'iter_based_cfg', build_train_loop=True)
    loop = runner.train_loop
    assert list(built_loops(runner)) == [loop] and loop.dataloader is not None
    let_go_of_loaders(runner)
    assert loop.dataloader is None and loop.dataloader_iterator is None
