"""The GPU-rank rehearsal at two nodes, and more ranks than GPUs, through ``dist_train.sh``.

Two fake nodes of 2 GPUs each (two ``dist_train.sh CFG 2`` on loopback, each node its own fake
host): the 4 ranks decide as GPU ranks do, agree, train, save and resume, each on its own
device. Two ranks on a host of one GPU stop before the rendezvous with one line that names both
numbers and the fix, and the fix it names (the processes on the CPU) trains.
"""
import json
import os.path as osp

import pytest

from mmddp_ext.gpu.fake import make_fake_host
from mmddp_launch.rendezvous import find_free_port

from conftest import (DEMO_CONFIG, assert_not_trained, check_ok, demo_options, demo_with_hooks,
                      finish, popen, run)


def _two_nodes(tmp_path, demo_data, records: str, epochs: int, resume: bool) -> str:
    """Both nodes of one 4-rank job on their own fake hosts; the output of node 0."""
    cfg = demo_with_hooks(tmp_path, f"dict(type='FakeGpuHook', out_dir={records!r})",
                          ['fake_gpu_hook'], f'demo_{osp.basename(records)}.py')
    port = str(find_free_port())
    procs = [
        popen([
            'bash', 'tools/dist_train.sh', cfg, '2', '--work-dir',
            str(tmp_path / 'w'), *(['--resume'] if resume else []),
            *demo_options(demo_data, epochs, sync_bn='torch')
        ], env=dict(NNODES='2', NODE_RANK=str(n), MASTER_ADDR='127.0.0.1', PORT=port,
                    **make_fake_host(str(tmp_path / f'node{n}'), count=2))) for n in range(2)
    ]
    outs = []
    for rc, out in finish(procs):
        assert rc == 0, out[-4000:]
        outs.append(out)
    return outs[0]


def _records(folder: str) -> dict:
    return {r: json.load(open(osp.join(folder, f'rank{r}.json'))) for r in range(4)}


@pytest.mark.slow
def test_two_fake_nodes_of_two_gpus_train_save_and_resume_as_gpu_ranks(demo_data, tmp_path):
    out = _two_nodes(tmp_path, demo_data, str(tmp_path / 'first'), 1, resume=False)
    assert '4 ranks agree' in out, out[-3000:]
    assert osp.isfile(str(tmp_path / 'w' / 'epoch_1.pth'))
    out = _two_nodes(tmp_path, demo_data, str(tmp_path / 'resumed'), 2, resume=True)
    assert 'Epoch(train) [2]' in out and 'Epoch(train) [1]' not in out, out[-3000:]
    assert osp.isfile(str(tmp_path / 'w' / 'epoch_2.pth'))
    for run_name in ('first', 'resumed'):
        for rank, record in _records(str(tmp_path / run_name)).items():
            local = rank % 2  # rank = node_rank × 2 + local_rank
            assert record['current'] == local and record['touched'] == [local], record
            backend, sync_bn, device = record['replacements']
            assert 'process-group backend nccl as on a GPU; gloo used' in backend
            assert f'DDP device_ids [{local}] as on a GPU; None used' in device
            assert 'layer(s) kept as on a GPU; BatchNorm used' in sync_bn


@pytest.mark.slow
def test_more_ranks_than_gpus_stop_in_one_line_and_the_cpu_fix_trains(demo_data, tmp_path):
    host = make_fake_host(str(tmp_path / 'host'), count=1)
    cmd = ['bash', 'tools/dist_train.sh', DEMO_CONFIG, '2', '--work-dir', str(tmp_path / 'w')]
    proc = run(cmd + demo_options(demo_data, 1), env=host)
    out = proc.stdout
    assert proc.returncode != 0, out[-3000:]
    assert_not_trained(out)
    line = ("2 processes on this node (LOCAL_WORLD_SIZE=2) but 1 GPU(s) visible "
            "(CUDA_VISIBLE_DEVICES=None): each process needs a GPU of its own. Start at most 1 "
            "per node (bash tools/dist_train.sh CONFIG 1), make more GPUs visible, or run the 2 "
            "processes on the CPU: CUDA_VISIBLE_DEVICES= bash tools/dist_train.sh CONFIG 2")
    assert line in out, out[-3000:]
    out = check_ok(run(cmd + demo_options(demo_data, 1), env=dict(host, CUDA_VISIBLE_DEVICES='')))
    assert 'Epoch(train) [1]' in out and 'fake GPU host' not in out
