"""launcher/layout: the one reader of a process's place in the job. Its own environment is read
once (Slurm asked once), a changed environment is read again, and tools/dist_train.py's early
device pin, which runs before the package can be imported, picks the local rank the reader
reads, for every launcher."""
import importlib.util
import os.path as osp

import pytest

from mmddp_ext.launcher import layout
from mmddp_ext.launcher.env import read_dist_env
from mmddp_ext.launcher.ways import slurm

from tests.launcher.test_env import MPI_PROCESS, SLURM_TASK

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TORCHRUN = dict(RANK='3', WORLD_SIZE='4', LOCAL_RANK='1', LOCAL_WORLD_SIZE='2', GROUP_RANK='1',
                MASTER_ADDR='10.0.0.1', MASTER_PORT='29500', TORCHELASTIC_RUN_ID='x')
HAND_SET = dict(RANK='3', WORLD_SIZE='4', MASTER_ADDR='10.0.0.1', MASTER_PORT='29500')


@pytest.fixture
def slurm_asked(monkeypatch):
    """The calls to Slurm for the master's address, answered without Slurm."""
    calls = []

    def master_addr(environ):
        calls.append(dict(environ))
        return '10.0.0.7'

    monkeypatch.setattr(slurm, 'master_addr', master_addr)
    return calls


def _set(monkeypatch, variables):
    for name in list(TORCHRUN) + list(SLURM_TASK) + list(MPI_PROCESS) + ['LOCAL_RANK']:
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)


def test_the_process_environment_is_read_once(monkeypatch, slurm_asked):
    _set(monkeypatch, SLURM_TASK)
    first = layout.read_launch_env('slurm', num_gpus=2)
    assert layout.read_launch_env('slurm', num_gpus=2) is first
    assert len(slurm_asked) == 1 and first.master_addr == '10.0.0.7'
    assert (first.rank, first.local_rank, first.world_size) == (3, 1, 4)


def test_a_changed_environment_is_read_again(monkeypatch, slurm_asked):
    _set(monkeypatch, SLURM_TASK)
    first = layout.read_launch_env('slurm', num_gpus=2)
    monkeypatch.setenv('SLURM_PROCID', '2')
    monkeypatch.setenv('SLURM_LOCALID', '0')
    second = layout.read_launch_env('slurm', num_gpus=2)
    assert (second.rank, second.local_rank) == (2, 0) and first.rank == 3
    assert len(slurm_asked) == 2
    assert layout.read_launch_env('slurm', num_gpus=4) is not second  # another GPU count


def test_a_given_environment_is_read_each_time(slurm_asked):
    environ = dict(SLURM_TASK)
    assert layout.read_launch_env('slurm', 2,
                                  environ) == layout.read_launch_env('slurm', 2, environ)
    assert len(slurm_asked) == 2


def _early_local_rank():
    spec = importlib.util.spec_from_file_location('_dist_train_script',
                                                  osp.join(ROOT, 'tools', 'dist_train.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # the script's functions; its __main__ part does not run
    return module.early_local_rank


@pytest.mark.parametrize('launcher, environ', [('pytorch', TORCHRUN), ('slurm', SLURM_TASK),
                                               ('mpi', dict(MPI_PROCESS, MASTER_ADDR='10.0.0.1'))])
def test_the_early_pin_picks_the_local_rank_the_reader_reads(launcher, environ):
    read = read_dist_env(environ, launcher, num_gpus=2, asked={'master_addr': '10.0.0.7'})
    assert _early_local_rank()(environ) == read.local_rank == 1


def test_the_early_pin_leaves_a_derived_local_rank_to_the_reader():
    """By hand without LOCAL_RANK: the package derives it (RANK % GPUs); the early pin does
    not guess."""
    assert _early_local_rank()(HAND_SET) is None
    assert read_dist_env(HAND_SET, 'pytorch', num_gpus=2).local_rank == 1
