"""The launcher-environment reader: one clear error per mistake, torchrun's formulas."""
import pytest

from mmddp_ext.launcher.env import DistEnvError, detect_launcher, read_dist_env
from mmddp_ext.launcher.ways import slurm

MASTER = dict(MASTER_ADDR='127.0.0.1', MASTER_PORT='29500')


@pytest.mark.parametrize(
    'environ, launcher',
    [
        ({}, 'none'),
        (dict(RANK='0', WORLD_SIZE='2'), 'pytorch'),
        (dict(WORLD_SIZE='2'), 'pytorch'),
        (dict(SLURM_PROCID='0', SLURM_STEP_NUM_TASKS='4'), 'slurm'),
        (dict(SLURM_PROCID='0', SLURM_STEP_NUM_TASKS='1'), 'none'),  # `srun -n1`: one process
        (dict(SLURM_PROCID='0', SLURM_NTASKS='8'), 'none'),  # batch script, not inside srun
        (dict(SLURM_PROCID='0', SLURM_STEP_NUM_TASKS='4', RANK='1', WORLD_SIZE='4'), 'pytorch'),
        (dict(OMPI_COMM_WORLD_SIZE='2', OMPI_COMM_WORLD_RANK='1'), 'mpi'),
        (dict(OMPI_COMM_WORLD_SIZE='1', OMPI_COMM_WORLD_RANK='0'), 'none'),  # mpirun -np 1
    ])
def test_detect_launcher(environ, launcher):
    assert detect_launcher(environ) == launcher


def test_no_launcher_is_a_single_process():
    env = read_dist_env({})
    assert (env.distributed, env.rank, env.world_size) == (False, 0, 1)


# torchrun, 2 nodes x 2 processes: rank = node_rank * nproc_per_node + local_rank
@pytest.mark.parametrize('node, local', [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_torchrun_two_by_two(node, local):
    environ = dict(MASTER, RANK=str(node * 2 + local), LOCAL_RANK=str(local), WORLD_SIZE='4',
                   LOCAL_WORLD_SIZE='2', GROUP_RANK=str(node), GROUP_WORLD_SIZE='2',
                   TORCHELASTIC_RUN_ID='x')
    env = read_dist_env(environ, num_gpus=2)
    assert env.rank == env.node_rank * env.local_world_size + env.local_rank
    assert (env.node_rank, env.local_rank, env.world_size, env.nnodes) == (node, local, 4, 2)
    assert env.under_torchrun and env.local_rank_source == 'LOCAL_RANK'
    assert env.warnings  # loopback master with 2 nodes


@pytest.mark.parametrize(
    'rank, num_gpus, extra, local, lws, node',
    [
        (3, 2, {}, 1, 2, 1),  # derived from the visible GPUs
        (3, 1, {}, 0, 1, 3),  # CUDA_VISIBLE_DEVICES=<one GPU>
        (5, 8, dict(LOCAL_WORLD_SIZE='4'), 1, 4, 1),  # LOCAL_WORLD_SIZE given
        (1, 0, {}, 1, 2, 0),  # CPU: LOCAL_RANK = RANK
        (1, 0, dict(NODE_RANK='0'), 1, 2, 0),
    ])
def test_manual_launch_derives_local_rank(rank, num_gpus, extra, local, lws, node):
    environ = dict(MASTER, RANK=str(rank), WORLD_SIZE=str(max(rank + 1, 2)), **extra)
    env = read_dist_env(environ, num_gpus=num_gpus)
    assert (env.local_rank, env.local_world_size, env.node_rank) == (local, lws, node)
    assert env.local_rank_source.startswith('derived')
    assert env.as_environ()['LOCAL_RANK'] == str(local)


@pytest.mark.parametrize(
    'environ, num_gpus, words',
    [
        (dict(MASTER, WORLD_SIZE='2'), 0, ['RANK is not set', 'WORLD_SIZE=2', '0..1']),
        (dict(MASTER, RANK='1'), 0, ['WORLD_SIZE is not set', 'RANK=1']),
        (dict(MASTER, RANK='2', WORLD_SIZE='2'), 0, ['RANK=2', 'out of range', '0..1']),
        (dict(MASTER, RANK='-1', WORLD_SIZE='2'), 0, ['RANK=-1', 'out of range']),
        (dict(MASTER, RANK='x', WORLD_SIZE='2'), 0, ["RANK='x'", 'not an integer']),
        (dict(MASTER, RANK='0', WORLD_SIZE='0'), 0, ['WORLD_SIZE=0']),
        (dict(MASTER, RANK='0', WORLD_SIZE='4',
              LOCAL_RANK='2'), 2, ['LOCAL_RANK=2', '2 GPU(s) are visible', '--nproc_per_node=2']),
        (dict(MASTER, RANK='0', WORLD_SIZE='2', LOCAL_RANK='0', LOCAL_WORLD_SIZE='2'), 1, [
            '2 processes on this node (LOCAL_WORLD_SIZE=2) but 1 GPU(s) visible',
            'dist_train.sh CONFIG 1', 'CUDA_VISIBLE_DEVICES= bash tools/dist_train.sh CONFIG 2'
        ]),  # more ranks than GPUs: rank 0 stops too, before any rendezvous
        (dict(RANK='0', WORLD_SIZE='2', MASTER_PORT='29500'), 0, ['MASTER_ADDR is not set']),
        (dict(RANK='0', WORLD_SIZE='2', MASTER_ADDR='h'), 0, ['MASTER_PORT is not set', '29500']),
        (dict(RANK='0', WORLD_SIZE='2', MASTER_ADDR='h',
              MASTER_PORT='http'), 0, ["MASTER_PORT='http'", 'not a TCP port']),
        (dict(RANK='0', WORLD_SIZE='2', MASTER_ADDR='h',
              MASTER_PORT='70000'), 0, ["MASTER_PORT='70000'"]),
        ({}, 0, ['--launcher pytorch', 'torchrun']),
    ])
def test_each_mistake_is_one_line_naming_value_and_fix(environ, num_gpus, words):
    with pytest.raises(DistEnvError) as e:
        read_dist_env(environ, launcher='pytorch', num_gpus=num_gpus)
    msg = str(e.value)
    assert '\n' not in msg
    for w in words:
        assert w in msg


def test_loopback_master_with_several_nodes_warns_but_works():
    env = read_dist_env(
        dict(MASTER, RANK='2', WORLD_SIZE='4', NNODES='2', LOCAL_RANK='0'), num_gpus=0)
    assert env.nnodes == 2
    assert any('MASTER_ADDR=127.0.0.1' in w and 'loopback' in w for w in env.warnings)
    single = read_dist_env(dict(MASTER, RANK='1', WORLD_SIZE='2'))
    assert single.warnings == ()


# Recorded from `srun -N2 --ntasks-per-node=2` (task 3: second task of the second node)
SLURM_TASK = dict(SLURM_PROCID='3', SLURM_NTASKS='4', SLURM_LOCALID='1', SLURM_NODEID='1',
                  SLURM_NNODES='2', SLURM_NODELIST='gpu-node[07-08]', SLURM_JOB_ID='123456',
                  SLURM_STEP_NUM_TASKS='4', SLURM_TASKS_PER_NODE='2(x2)')


def test_slurm_mapping():
    env = read_dist_env(SLURM_TASK, num_gpus=2)
    assert env.launcher == 'slurm'
    assert (env.rank, env.world_size, env.local_rank, env.node_rank, env.nnodes) == \
        (3, 4, 1, 1, 2)
    assert env.local_world_size == 2
    assert env.rank == env.node_rank * env.local_world_size + env.local_rank
    assert (env.master_addr, env.master_port) == ('gpu-node07', 20000 + 123456 % 10000)


@pytest.mark.parametrize(
    'extra, resolved, master',
    [
        ({}, '10.0.0.7', '10.0.0.7'),  # the NodeAddr Slurm gave (mmddp_ext.launcher.ways.slurm)
        ({}, None, 'gpu-node07'),  # scontrol could not say: the node's name
        (dict(MASTER_ADDR='10.1.2.3'), '10.0.0.7', '10.1.2.3'),  # the user's choice wins
    ])
def test_slurm_master_addr_is_the_address_slurm_gives(extra, resolved, master):
    env = read_dist_env(
        dict(SLURM_TASK, **extra), num_gpus=2, asked={'master_addr': resolved} if resolved else {})
    assert env.master_addr == master


def test_slurm_explicit_master_wins_and_missing_var_is_named():
    out = slurm.to_torch(dict(SLURM_TASK, MASTER_ADDR='10.1.2.3', MASTER_PORT='29501'), {})
    assert (out['MASTER_ADDR'], out['MASTER_PORT']) == ('10.1.2.3', '29501')
    broken = {k: v for k, v in SLURM_TASK.items() if k != 'SLURM_LOCALID'}
    with pytest.raises(DistEnvError, match='SLURM_LOCALID is not set.*srun'):
        read_dist_env(broken, launcher='slurm')


@pytest.mark.parametrize('nodelist, host', [
    ('node01', 'node01'),
    ('node[01-04,07]', 'node01'),
    ('node[007-009]', 'node007'),
    ('a[3,5],b1', 'a3'),
    ('gpu-a1,gpu-b2', 'gpu-a1'),
    ('rack[2-3]-ib', 'rack2-ib'),
])
def test_first_slurm_host(nodelist, host):
    assert slurm.first_host(nodelist) == host


def test_unparsable_nodelist():
    with pytest.raises(DistEnvError, match="SLURM_NODELIST='\\[' .*MASTER_ADDR"):
        slurm.first_host('[')


def test_a_slurm_task_says_how_many_cpus_it_has():
    env = read_dist_env(dict(SLURM_TASK, SLURM_CPUS_PER_TASK='5'), num_gpus=2)
    assert (env.task_cpus, env.task_cpus_of) == (5, 'its Slurm task')
    assert read_dist_env(SLURM_TASK, num_gpus=2).task_cpus is None  # no --cpus-per-task
    torchrun_in_a_task = dict(MASTER, RANK='0', WORLD_SIZE='2', TORCHELASTIC_RUN_ID='x',
                              SLURM_CPUS_PER_TASK='5')
    assert read_dist_env(torchrun_in_a_task).task_cpus is None  # its ranks share the task


# OpenMPI's variables, as `mpirun -np 4` on 2 hosts sets them for the second process of host 1
MPI_PROCESS = dict(OMPI_COMM_WORLD_RANK='3', OMPI_COMM_WORLD_SIZE='4',
                   OMPI_COMM_WORLD_LOCAL_RANK='1', OMPI_COMM_WORLD_LOCAL_SIZE='2',
                   OMPI_MCA_ess_base_jobid='1741160449')


@pytest.mark.parametrize(
    'extra, expected',
    [
        # two hosts: MASTER_ADDR given with mpirun -x; the port from the job id
        (dict(MASTER_ADDR='10.0.0.1'), (3, 4, 1, 2, 1, 2, '10.0.0.1', 20000 + 1741160449 % 10000)),
        (dict(MASTER_ADDR='10.0.0.1', MASTER_PORT='29511'), (3, 4, 1, 2, 1, 2, '10.0.0.1', 29511)),
        # one host: loopback
        (dict(OMPI_COMM_WORLD_SIZE='2', OMPI_COMM_WORLD_RANK='1'),
         (1, 2, 1, 2, 0, 1, '127.0.0.1', 20000 + 1741160449 % 10000)),
    ])
def test_mpirun_layout(extra, expected):
    env = read_dist_env(dict(MPI_PROCESS, **extra), launcher='mpi')
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size, env.node_rank,
            env.nnodes, env.master_addr, env.master_port) == expected
    assert env.rank == env.node_rank * env.local_world_size + env.local_rank
    assert env.launcher == 'mpi'


def test_mpirun_on_several_hosts_needs_master_addr_and_missing_vars_are_named():
    with pytest.raises(DistEnvError, match='MASTER_ADDR is not set.*mpirun -x MASTER_ADDR='):
        read_dist_env(MPI_PROCESS, launcher='mpi')
    broken = {k: v for k, v in MPI_PROCESS.items() if k != 'OMPI_COMM_WORLD_LOCAL_RANK'}
    with pytest.raises(DistEnvError, match='OMPI_COMM_WORLD_LOCAL_RANK is not set.*mpirun'):
        read_dist_env(dict(broken, MASTER_ADDR='10.0.0.1'), launcher='mpi')
