"""The screens failed ranks print themselves where no front of ours runs
(``mmddp_ext/diagnose/rank_screen.py``): the fault config and the checks the launch ways share
(tests/e2e/test_rank_screens.py, tests/mpi/, tests/slurm/)."""
import re

from conftest import demo_with_hooks


def fault_config(tmp_path, fault: str) -> str:
    return demo_with_hooks(tmp_path, f"dict(type='FaultHook', rank=1, at_iter=3, fault='{fault}')",
                           ['fault_hook'], f'{fault}.py')


def screen_of(out: str, rank: int) -> str:
    """Rank ``rank``'s own screen in ``out`` (up to the next screen or the end)."""
    start_at = out.index(f'==== mmddp_ext: rank {rank} failed (what this rank sees) ====')
    rest = out[start_at:]
    end = rest.find('==== mmddp_ext', 10)
    return rest if end < 0 else rest[:end]


def assert_raise_screens(out: str, work: str) -> None:
    own = screen_of(out, 1)
    assert 'ValueError: injected fault on rank 1 at iteration 3' in own, out[-4000:]
    assert 'fault_hook.py' in own and 'full traceback:' in own
    lost = screen_of(out, 0)
    assert 'lost its peer after iteration 2' in lost, lost
    assert re.search(r'rank 1 \(host \S+, pid \d+\) raised ValueError: injected fault', lost), lost
    for screen in (own, lost):
        assert f'the whole job: python -m mmddp_ext.diagnose {work}' in screen


def assert_killed_screen(out: str, work: str) -> None:
    lost = screen_of(out, 0)
    assert 'lost its peer after iteration 2' in lost, out[-4000:]
    assert re.search(
        r'rank 1 \(host \S+, pid \d+\) ended after iteration 2 without a Python exception: '
        r'killed by a signal', lost), lost
    assert f'the whole job: python -m mmddp_ext.diagnose {work}' in lost
    assert '==== mmddp_ext: rank 1 failed' not in out  # a killed rank prints nothing
