"""The end of a run frees what it built, in order (``mmddp_ext.runner.teardown``), with the
demo config's own DataLoader workers (2, persistent): the workers have ended when the runner and
its DDP model are destroyed, which is while the process group is still alive; a library call
frees its runner before it returns."""
import json
import os.path as osp

import pytest

from conftest import DEMO_WORKERS, PYTHON, check_ok, demo_options, demo_with_hooks, run


def _probe_config(tmp_path) -> tuple:
    out = str(tmp_path / 'probe')
    return demo_with_hooks(tmp_path, f"dict(type='ModelTeardownProbe', out_dir={out!r})",
                           ['teardown_probe']), out


def _noted(out: str, rank: int) -> dict:
    path = osp.join(out, f'rank{rank}.json')
    assert osp.isfile(path), f'rank {rank}: the model was never destroyed'
    with open(path) as f:
        return json.load(f)


@pytest.mark.slow
def test_two_ranks_free_the_model_before_the_group(demo_data, tmp_path):
    cfg, out = _probe_config(tmp_path)
    proc = run([
        'bash', 'tools/dist_train.sh', cfg, '2', '--work-dir',
        str(tmp_path / 'w'), *demo_options(demo_data, 1, **DEMO_WORKERS)
    ])
    text = check_ok(proc)
    assert 'terminate called' not in text
    for rank in (0, 1):
        assert _noted(out, rank) == dict(group_alive=True, workers=2, workers_running=0)


@pytest.mark.slow
def test_a_library_call_frees_its_runner_before_it_returns(demo_data, tmp_path):
    """``main([...])`` from a caller's Python, one process: the model is gone when it
    returns (nothing of the run kept in the caller's process), the caller's freeze as it was."""
    cfg, out = _probe_config(tmp_path)
    code = ('import gc, os, sys; from mmddp_ext.entry.train import main\n'
            'frozen = gc.get_freeze_count()\n'
            'rc = main(sys.argv[1:])\n'
            f'print("RESULT", rc, os.path.isfile({osp.join(out, "rank0.json")!r}), '
            'gc.get_freeze_count() == frozen)\n')
    proc = run([
        PYTHON, '-c', code, cfg, '--work-dir',
        str(tmp_path / 'w'), *demo_options(demo_data, 1, **DEMO_WORKERS)
    ])
    text = check_ok(proc)
    assert text.strip().splitlines()[-1] == 'RESULT 0 True True', text[-3000:]
    # one process: no group
    assert _noted(out, 0) == dict(group_alive=False, workers=2, workers_running=0)
