"""Threads per rank where the user chose none (``mmddp_ext/node/threads.py``): the node's cores
shared, one per DataLoader worker, a scheduler's own CPUs; the user's and torchrun's
``OMP_NUM_THREADS`` told apart."""
import pytest

from mmddp_ext.launcher import ways
from mmddp_ext.node.threads import OMP_UNSET_ENV, threads_per_process


@pytest.mark.parametrize(
    'environ, local_world, cores, expected',
    [
        ({}, 2, 2, 1),
        ({}, 2, 16, 8),
        ({}, 4, 2, 1),  # never below one
        ({}, 1, None, 1),  # cpu_count unknown
        ({
            'OMP_NUM_THREADS': '3'
        }, 2, 16, None),  # the user chose
        ({
            'OMP_NUM_THREADS': ''
        }, 2, 16, 8),  # empty: not chosen
        ({
            'OMP_NUM_THREADS': '1',
            OMP_UNSET_ENV: '1'
        }, 2, 16, 8),  # torchrun's default under dist_train.sh: not chosen
    ])
def test_threads_per_process(environ, local_world, cores, expected):
    assert threads_per_process(environ, local_world, cores) == expected


@pytest.mark.parametrize(
    'local_world, cores, workers, expected',
    [
        (2, 16, 2, 6),  # 8 cores per rank, 2 of them for its workers
        (8, 64, 4, 4),
        (2, 2, 2, 1),  # never below one
    ])
def test_each_worker_takes_a_core(local_world, cores, workers, expected):
    assert threads_per_process({}, local_world, cores, workers) == expected


@pytest.mark.parametrize(
    'launcher, per_task, cores, workers, expected',
    [
        ('slurm', '5', 64, 2, 3),  # slurm_train.sh's 5 CPUs per task, whatever the node has
        ('slurm', '5', 4, 0, 4),  # never more than the task may run on
        ('slurm', '', 64, 2, 6),  # no --cpus-per-task: the node's cores, shared by 8
        ('pytorch', '5', 64, 2, 6),  # torchrun inside one Slurm task: its ranks share the task
    ])
def test_a_slurm_task_has_its_own_cpus(launcher, per_task, cores, workers, expected):
    environ = {'SLURM_CPUS_PER_TASK': per_task, 'TORCHELASTIC_RUN_ID': 'x'}
    task_cpus = ways.named(launcher, environ).task_cpus(environ)  # as read_dist_env asks
    assert threads_per_process(environ, 8, cores, workers, task_cpus) == expected
