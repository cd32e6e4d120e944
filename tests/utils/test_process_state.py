"""Our library calls leave the caller's process as they found it: the collector (on or off, no
object frozen), the environment, ``RLIMIT_AS``, the warning filters, torch's thread count and
oneDNN (``tests.helpers.process_state``). Each call is shown to change them while it runs (a CPU
memory budget, ``--unsafe-load``, our warning filters), so the checks are not empty."""
import gc
import resource

import pytest

from mmddp_ext.utils import process_state

from conftest import DEMO_CONFIG, demo_options
from tests.helpers.process_state import changes, snapshot

BUDGET = {'scaling.memory_budget_mib': '3000'}  # a CPU budget: RLIMIT_AS, oneDNN off, an env var


def _options(data: str, tmp_path, **extra) -> list:
    """The demo's options, with a visualizer of its own: MMPose's configs name theirs
    'visualizer', and a second runner in one process would take the first one's (writing to
    the first run's folder)."""
    return demo_options(data, 1, **extra, **{'visualizer.name': tmp_path.name})


@pytest.fixture
def collector_off():
    """The caller has switched the collector off, as a start-up-heavy program does."""
    was = gc.isenabled()
    gc.disable()
    yield
    (gc.enable if was else gc.disable)()


@pytest.mark.slow
def test_explain_leaves_the_callers_process_as_it_was(demo_data, tmp_path, collector_off):
    from mmddp_ext.entry.train import main
    before = snapshot()
    assert main([
        DEMO_CONFIG, '--explain', '--work-dir',
        str(tmp_path), '--unsafe-load', *_options(demo_data, tmp_path)
    ]) == 0
    assert changes(before, snapshot()) == {}


@pytest.mark.slow
def test_training_from_main_leaves_the_callers_process_as_it_was(demo_data, tmp_path,
                                                                 collector_off):
    from mmddp_ext.entry.train import main
    before = snapshot()
    assert main([
        DEMO_CONFIG, '--work-dir',
        str(tmp_path), '--unsafe-load', *_options(demo_data, tmp_path, **BUDGET)
    ]) == 0
    assert (tmp_path / 'epoch_1.pth').exists()  # it trained
    assert changes(before, snapshot()) == {}


@pytest.mark.slow
def test_a_ddp_runner_puts_back_what_it_set_when_its_run_ends(demo_data, tmp_path):
    from mmddp_ext.entry.train import build_config, parse_args
    from mmddp_ext.runner import DDPRunner
    cfg = build_config(
        parse_args(
            [DEMO_CONFIG, '--work-dir',
             str(tmp_path), *_options(demo_data, tmp_path, **BUDGET)]))
    before = snapshot()
    runner = DDPRunner.from_cfg(cfg)
    during = changes(before, snapshot())
    assert 'rlimit_as' in during and 'warning_filters' in during, during  # the budget, quiet
    runner.train()
    assert changes(before, snapshot()) == {}


@pytest.mark.slow
def test_launch_leaves_the_callers_process_as_it_was(demo_data, tmp_path):
    """torch's launcher sets variables in the calling process (TORCHELASTIC_*); the workers
    are ours and keep the run's settings."""
    import mmddp_ext
    before = snapshot()
    result = mmddp_ext.launch(DEMO_CONFIG, nproc_per_node=2,
                              args=['--work-dir',
                                    str(tmp_path), *_options(demo_data, tmp_path)])
    assert result == {0: 0, 1: 0}
    assert changes(before, snapshot()) == {}


def test_nothing_is_kept_where_our_entry_owns_the_process(monkeypatch):
    monkeypatch.setattr(process_state, '_OWNED', False)
    state = process_state.snapshot()
    assert state is not None
    process_state.restore(state)
    monkeypatch.setattr(process_state, '_OWNED', True)
    assert process_state.owns_process() and process_state.snapshot() is None


def test_restore_puts_back_each_setting_once():
    import os

    import torch
    state = process_state.snapshot()
    before = snapshot()
    os.environ['MMDDP_PROCESS_STATE_TEST'] = '1'
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (64 * 2**30, hard))
    torch.set_num_threads(max(1, torch.get_num_threads() - 1) if torch.get_num_threads() > 1 else 2)
    import warnings
    warnings.filterwarnings('ignore', message='process state test')
    assert set(changes(before, snapshot())) >= {
        'environ[MMDDP_PROCESS_STATE_TEST]', 'rlimit_as', 'torch_threads', 'warning_filters'
    }
    process_state.restore(state)
    assert changes(before, snapshot()) == {}
    os.environ['MMDDP_PROCESS_STATE_TEST'] = '2'
    process_state.restore(state)  # a second restore does nothing
    assert os.environ.pop('MMDDP_PROCESS_STATE_TEST') == '2'
