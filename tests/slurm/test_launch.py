"""The demo trained across the two nodes of a real local Slurm cluster (tests/slurm/cluster.py):
``srun ... --launcher slurm``, the same inside an ``sbatch`` job (tools/slurm_sbatch.sh), and
``tools/slurm_train.sh`` on a partition without GPUs and on one with GPUs but no GRES."""
import glob
import json
import os.path as osp
import re
import socket

import pytest

from conftest import DEMO_CONFIG, PYTHON, ROOT, check_ok, demo_options, run

pytestmark = pytest.mark.slow

# the rank layout line of tools/dist_train.py, per rank
LAYOUT = re.compile(r'RANK (\d+) of WORLD_SIZE (\d+) = node (\d+) \(of (\d+)\) × (\d+) per node '
                    r'\+ LOCAL_RANK (\d+) \[[^\]]*\]; master ([^:\s]+):(\d+); launcher slurm')


def _layouts(out: str) -> dict:
    """``{rank: (world, node, nnodes, per_node, local_rank, master_addr)}`` from the log."""
    return {
        int(m[0]): (int(m[1]), int(m[2]), int(m[3]), int(m[4]), int(m[5]), m[6])
        for m in LAYOUT.findall(out)
    }


def _check_trained(out: str, work_dir: str, nodes: int, per_node: int) -> None:
    """The plan, rank 0's layout line (the log is rank 0's), every rank's memory row and
    progress record, and the checkpoint, for world size = nodes × tasks per node."""
    world = nodes * per_node
    assert f'per-GPU batch {32 // world} × {world} GPUs × accumulation 1 = global 32' in out
    # the NodeAddr of n1, not the name 'n1'
    assert _layouts(out) == {0: (world, 0, nodes, per_node, 0, '127.0.0.1')}, out[-3000:]
    for rank in range(world):  # RankMemoryHook's table: one row per rank
        assert re.search(rf'rank {rank} \S+ pid \d+ cpu', out), out[-3000:]
        assert glob.glob(osp.join(work_dir, '*', 'memory', f'rank{rank}.jsonl'))
        progress = json.load(open(osp.join(work_dir, 'ranks', f'rank{rank}.json')))
        assert (progress['world_size'], progress['completed_iter']) == (world, 64 // 32)
    assert f'Epoch(train) [1][{64 // 32}/{64 // 32}]' in out
    assert osp.isfile(osp.join(work_dir, 'epoch_1.pth'))


def test_node_names_are_not_resolvable_here():
    """The precondition of the address tests: n1 is a name only Slurm knows."""
    with pytest.raises(OSError):
        socket.gethostbyname('n1')


def test_master_addr_is_the_first_nodes_address(slurm):
    probe = ('from mmddp_ext.launcher.layout import read_launch_env; '
             'print(read_launch_env().describe())')
    out = check_ok(
        run(['srun', '-N2', '--ntasks-per-node=1', PYTHON, '-c', probe],
            env=dict(SLURM_CONF=slurm.conf), timeout=120))
    # one task on each node; the master is n1's NodeAddr (127.0.0.1), not its name
    assert _layouts(out) == {r: (2, r, 2, 1, 0, '127.0.0.1') for r in (0, 1)}, out


def test_srun_trains_across_two_nodes(slurm, demo_data, tmp_path):
    work = str(tmp_path / 'w')
    out = check_ok(
        run([
            'srun', '-N2', '--ntasks-per-node=1', PYTHON, 'tools/dist_train.py', DEMO_CONFIG,
            '--launcher', 'slurm', '--work-dir', work, *demo_options(demo_data, 1)
        ], env=dict(SLURM_CONF=slurm.conf)))
    _check_trained(out, work, nodes=2, per_node=1)


def test_sbatch_script_trains_across_two_nodes(slurm, demo_data, tmp_path):
    work, log = str(tmp_path / 'w'), str(tmp_path / 'job.out')
    sub = check_ok(
        run([
            'sbatch', '--parsable', f'--output={log}', 'tools/slurm_sbatch.sh', DEMO_CONFIG, work,
            *demo_options(demo_data, 1)
        ], env=dict(SLURM_CONF=slurm.conf), timeout=60))
    job = sub.strip().split(';')[0]
    info = slurm.wait_job(job)
    out = open(log).read()
    assert info['JobState'] == 'COMPLETED' and info['ExitCode'] == '0:0', out[-3000:]
    assert f'[slurm_sbatch] job {job} start 0 on n[1-2]' in out
    assert f'--resume: no checkpoint in {work} yet: starting from scratch' in out
    _check_trained(out, work, nodes=2, per_node=1)


@pytest.mark.parametrize('partition, gpus, per_node', [('cpu', 2, 1), ('gpu', 2, 2)])
def test_slurm_train_sh(slurm, demo_data, tmp_path, partition, gpus, per_node):
    """No GRES is configured on either partition: no --gres is asked (Slurm would refuse it),
    and GPUS_PER_NODE still sets the tasks per node; CPUS_PER_TASK sets each rank's threads."""
    work = str(tmp_path / 'w')
    out = check_ok(
        run([
            'bash',
            osp.join(ROOT, 'tools', 'slurm_train.sh'), partition, 'demo', DEMO_CONFIG, work,
            *demo_options(demo_data, 1)
        ], env=dict(SLURM_CONF=slurm.conf, GPUS=str(gpus), GPUS_PER_NODE=str(per_node),
                    CPUS_PER_TASK='1', OMP_NUM_THREADS='')))
    # no thread count chosen: each rank computes with its task's CPUs (--cpus-per-task)
    assert 'threads per process: 1 (1 CPUs of its Slurm task; OMP_NUM_THREADS was not set' in out
    assert (f"partition '{partition}' has no GPUs configured as GRES (sinfo -o %G): no --gres "
            f'asked; {per_node} task(s) per node') in out
    _check_trained(out, work, nodes=gpus // per_node, per_node=per_node)
