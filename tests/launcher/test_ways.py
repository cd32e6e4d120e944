"""The ways a job is started (``mmddp_ext/launcher/ways``): tried in their listed order, and a new
scheduler is one module and one entry in the list: the made-up one of
tests/helpers/fake_scheduler.py is detected, asked, mapped and offered by the command line."""
import pytest

from mmddp_ext.entry.cli import build_parser
from mmddp_ext.launcher import layout, ways
from mmddp_ext.launcher.env import detect_launcher

from tests.helpers import fake_scheduler

FAKE_TASK = dict(FAKE_TASK='5', FAKE_TASKS='8', FAKE_NODE_TASK='1', FAKE_NODE_TASKS='4',
                 FAKE_CPUS='6')


@pytest.fixture
def with_fake(monkeypatch):
    monkeypatch.setattr(ways, 'WAYS', ways.WAYS + (fake_scheduler, ))  # the one line


def test_the_order_is_the_listed_one():
    assert [w.__name__.rsplit('.', 1)[1]
            for w in ways.WAYS] == ['torchrun', 'by_hand', 'slurm', 'mpi']
    assert ways.names() == ('none', 'pytorch', 'slurm', 'mpi')
    both = dict(RANK='0', WORLD_SIZE='2', SLURM_PROCID='0', SLURM_STEP_NUM_TASKS='2')
    assert ways.detect(both) is ways.by_hand  # hand-set variables inside an srun step
    assert ways.detect(dict(both, TORCHELASTIC_RUN_ID='x')) is ways.torchrun


def test_a_new_scheduler_is_detected_and_read(with_fake):
    assert detect_launcher(FAKE_TASK) == 'fake'
    env = layout.read_launch_env(environ=FAKE_TASK, num_gpus=0)
    assert (env.launcher, env.rank, env.world_size, env.local_rank, env.local_world_size,
            env.node_rank, env.nnodes) == ('fake', 5, 8, 1, 4, 1, 2)
    assert (env.master_addr, env.master_port) == ('10.9.8.7', 20000 + 4242)  # asked, job port
    assert (env.task_cpus, env.task_cpus_of) == (6, "its fake-scheduler task")
    assert build_parser().parse_args(['cfg.py', '--launcher', 'fake']).launcher == 'fake'


def test_without_it_the_variables_mean_nothing():
    assert detect_launcher(FAKE_TASK) == 'none'
    with pytest.raises(SystemExit):
        build_parser().parse_args(['cfg.py', '--launcher', 'fake'])
