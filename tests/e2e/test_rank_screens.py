"""Where no front of ours prints the job's diagnosis, each failed rank prints its own screen after
its traceback: its cause and fix, or the peer it lost and what that peer left, and the command
for the whole job. Two launch ways here, rank 1 raising or killed by SIGKILL at iteration 3:
ranks started by hand, and torchrun itself (srun: tests/slurm/test_failures.py; mpirun:
tests/mpi/test_mpirun.py). Under dist_train.sh the ranks add nothing to its one screen
(tests/e2e/test_faults.py)."""
import pytest

from conftest import PYTHON, demo_options, run
from preloaded import start
from rank_screens import assert_killed_screen, assert_raise_screens, fault_config

pytestmark = pytest.mark.slow


@pytest.mark.parametrize('fault', ['raise', 'sigkill'])
def test_ranks_started_by_hand_print_their_screens(demo_data, tmp_path, fault):
    work = str(tmp_path / 'w')
    results = start(
        [fault_config(tmp_path, fault), '--work-dir', work, *demo_options(demo_data, 2)],
        str(tmp_path / 'ranks'), 2).wait(600)
    (code0, out0), (code1, out1) = results
    assert code0 != 0 and code1 != 0
    tail = out0[out0.rindex('Traceback'):]  # after rank 0's own traceback, its screen
    if fault == 'raise':
        assert_raise_screens(out1 + tail, work)
    else:
        assert code1 == -9 and not out1.count('==== mmddp_ext')
        assert_killed_screen(tail, work)


@pytest.mark.parametrize('fault', ['raise', 'sigkill'])
def test_torchrun_itself_ends_with_the_ranks_screens(demo_data, tmp_path, fault):
    work = str(tmp_path / 'w')
    proc = run([
        PYTHON, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',
        'tools/dist_train.py',
        fault_config(tmp_path, fault), '--work-dir', work, *demo_options(demo_data, 2)
    ])
    assert proc.returncode != 0
    (assert_raise_screens if fault == 'raise' else assert_killed_screen)(proc.stdout, work)
