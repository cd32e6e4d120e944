"""``mpirun -np 2 python tools/dist_train.py CONFIG --launcher mpi`` with OpenMPI from the
distribution's packages (``tools/install.sh --with-tests`` installs ``openmpi-bin``; skipped with
the reason where there is no ``mpirun``): the demo trains one epoch on 2 processes, each rank
sits where OpenMPI's variables put it, the data is split between them, and the plan line is the
one torchrun's run prints."""
import os
import shutil

import pytest

from conftest import PYTHON, check_ok, demo_options, read_records, recording_config, run
from rank_screens import assert_killed_screen, assert_raise_screens, fault_config

MPIRUN = shutil.which('mpirun')
pytestmark = pytest.mark.skipif(
    MPIRUN is None, reason='no mpirun: apt-get install openmpi-bin '
    '(tools/install.sh --with-tests does, as root)')


def _mpirun(np: int) -> list:
    root = ['--allow-run-as-root'] if os.geteuid() == 0 else []  # OpenMPI refuses root without
    return [MPIRUN, *root, '--oversubscribe', '-np', str(np)]


@pytest.mark.slow
def test_mpirun_trains_the_demo_on_two_processes(demo_data, tmp_path):
    rec = str(tmp_path / 'rec')
    out = check_ok(
        run([
            *_mpirun(2), PYTHON, 'tools/dist_train.py',
            recording_config(tmp_path, rec), '--launcher', 'mpi', '--work-dir',
            str(tmp_path / 'w'), *demo_options(demo_data, 1)
        ]))
    assert 'per-GPU batch 16 × 2 GPUs × accumulation 1 = global 32' in out
    assert 'Epoch(train) [1][2/2]' in out
    records = read_records(rec)
    assert sorted(records) == [0, 1]
    for rank, r in records.items():
        assert r['env']['RANK'] == str(rank) and r['env']['WORLD_SIZE'] == '2'
        assert r['env']['LOCAL_RANK'] == str(rank)
    seen = [r['samples'] for r in records.values()]
    assert all(len(s) == len(set(s)) == 32 for s in seen)  # half of the 64 images each, once
    assert not set(seen[0]) & set(seen[1]) and r['param_checksum'] == records[0]['param_checksum']


@pytest.mark.slow
@pytest.mark.parametrize('fault', ['raise', 'sigkill'])
def test_a_failed_rank_under_mpirun_prints_its_screen(demo_data, tmp_path, fault):
    """Rank 1 raises, or is killed by SIGKILL, at iteration 3: mpirun's output ends with the
    ranks' own screens (tests/e2e/test_rank_screens.py), not gloo's words alone."""
    work = str(tmp_path / 'w')
    proc = run([
        *_mpirun(2), PYTHON, 'tools/dist_train.py',
        fault_config(tmp_path, fault), '--launcher', 'mpi', '--work-dir', work,
        *demo_options(demo_data, 2)
    ])
    assert proc.returncode != 0
    (assert_raise_screens if fault == 'raise' else assert_killed_screen)(proc.stdout, work)
