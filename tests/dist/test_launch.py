"""Real multi-process launches on CPU (gloo): dist_train.sh, by hand, multi-node, launch()."""
import ast
import json
import math
import os
import os.path as osp
import re
import time

import pytest

from mmddp_ext.dist.launch import find_free_port

from conftest import (DEMO_CONFIG, PYTHON, check_ok, demo_options, finish, popen, read_records,
                      recording_config, run)

pytestmark = pytest.mark.slow


def _train_ids(data_root):
    """The ids of the training samples: one per person annotation of the train split."""
    with open(osp.join(data_root, 'annotations', 'train.json')) as f:
        return sorted(a['id'] for a in json.load(f)['annotations'])


def _global_batch_from_name(config):
    """N × M of the config name's ``NxbM`` (the global batch the recipe was written for)."""
    n, m = re.search(r'_(\d+)xb(\d+)-', osp.basename(config)).groups()
    return int(n) * int(m)


def _assert_disjoint_and_complete(records, world, data_root):
    """One epoch: every rank trained on its own share of the data, in batches of
    global / world, and the replicas ended equal (and different from where they started)."""
    assert sorted(records) == list(range(world))
    ids = _train_ids(data_root)
    global_batch = _global_batch_from_name(DEMO_CONFIG)
    per_device, iters = global_batch // world, math.ceil(len(ids) / global_batch)
    seen = [set(r['samples']) for r in records.values()]
    assert all(seen), 'every rank trained on samples'
    for i in range(world):
        for j in range(i + 1, world):
            assert not seen[i] & seen[j], f'ranks {i} and {j} saw the same samples'
    for rank, r in records.items():
        # its share: len(ids) / world samples, each once, in batches of per_device
        assert r['batch_sizes'] == [per_device] * iters, (rank, r['batch_sizes'])
        assert len(r['samples']) == len(set(r['samples'])) == len(ids) // world
    assert sorted(set().union(*seen)) == ids, 'the ranks together saw every sample'
    # DDP keeps the replicas equal: the same parameters, bit for bit, on every rank
    digests = {r['param_digest'] for r in records.values()}
    assert len(digests) == 1, {k: r['param_checksum'] for k, r in records.items()}
    checksums = [r['param_checksum'] for r in records.values()]
    assert max(checksums) == min(checksums)
    # ... and they started equal and training moved them
    assert len({r['param_digest_before'] for r in records.values()}) == 1
    assert digests != {r['param_digest_before'] for r in records.values()}


def test_dist_train_sh_two_processes(demo_data, tmp_path):
    rec = str(tmp_path / 'rec')
    out = check_ok(
        run([
            'bash', 'tools/dist_train.sh',
            recording_config(tmp_path, rec), '2', '--work-dir',
            str(tmp_path / 'w'), *demo_options(demo_data, 1)
        ]))
    records = read_records(rec)
    for rank, r in records.items():
        assert r['dist_world'] == 2
        assert r['env']['RANK'] == r['env']['LOCAL_RANK'] == str(rank)
    _assert_disjoint_and_complete(records, 2, demo_data)
    assert 'process group: gloo' in out and 'RANK 0 of WORLD_SIZE 2' in out
    assert osp.isfile(tmp_path / 'w' / 'epoch_1.pth')


def test_two_jobs_at_once_on_one_machine(demo_data, tmp_path):
    """Without PORT each job gets its own free port: neither clashes with the other."""
    procs = [
        popen([
            'bash', 'tools/dist_train.sh', DEMO_CONFIG, '2', '--work-dir',
            str(tmp_path / f'job{i}'), *demo_options(demo_data, 1)
        ]) for i in range(2)
    ]
    for rc, out in finish(procs):
        assert rc == 0, out[-4000:]
    for i in range(2):
        assert osp.isfile(tmp_path / f'job{i}' / 'epoch_1.pth')


def test_manual_env_launch_without_local_rank(demo_data, tmp_path):
    rec = str(tmp_path / 'rec')
    cfg = recording_config(tmp_path, rec)
    port = str(find_free_port())
    procs = [
        popen([
            PYTHON, 'tools/dist_train.py', cfg, '--work-dir',
            str(tmp_path / 'w'), *demo_options(demo_data, 1)
        ], env=dict(
            RANK=str(r), WORLD_SIZE='2', MASTER_ADDR='127.0.0.1', MASTER_PORT=port,
            OMP_NUM_THREADS='')) for r in range(2)
    ]
    results = finish(procs)
    for rc, out in results:
        assert rc == 0, out[-4000:]
    # no thread count chosen: the cores are shared, as torchrun would (not one per core);
    # rank 0 logs it (MMEngine shows only errors of the other ranks)
    m = re.search(r'threads per process: (\d+) \((\d+) cores shared by 2 processes', results[0][1])
    assert m and int(m[1]) == max(1, int(m[2]) // 2), results[0][1][-4000:]
    records = read_records(rec)
    for rank, r in records.items():
        assert r['env']['LOCAL_RANK'] == str(rank)  # derived on CPU: LOCAL_RANK = RANK
        assert r['threads'] == max(1, os.cpu_count() // 2)
    _assert_disjoint_and_complete(records, 2, demo_data)


def test_two_nodes_of_two_processes_on_loopback(demo_data, tmp_path):
    rec = str(tmp_path / 'rec')
    cfg = recording_config(tmp_path, rec)
    port = str(find_free_port())
    procs = [
        popen([
            PYTHON, '-m', 'torch.distributed.run', '--nnodes=2', f'--node_rank={n}',
            '--nproc_per_node=2', '--master_addr=127.0.0.1', f'--master_port={port}',
            'tools/dist_train.py', cfg, '--work-dir',
            str(tmp_path / 'w'), *demo_options(demo_data, 1)
        ]) for n in range(2)
    ]
    for rc, out in finish(procs):
        assert rc == 0, out[-4000:]
    records = read_records(rec)
    for rank, r in records.items():
        env = {k: int(v) for k, v in r['env'].items()}
        assert env['WORLD_SIZE'] == 4 == 2 * env['LOCAL_WORLD_SIZE']  # nnodes × nproc
        assert env['RANK'] == rank == env['GROUP_RANK'] * 2 + env['LOCAL_RANK']
    assert {(r['env']['GROUP_RANK'], r['env']['LOCAL_RANK']) for r in records.values()} == \
        {('0', '0'), ('0', '1'), ('1', '0'), ('1', '1')}
    _assert_disjoint_and_complete(records, 4, demo_data)


def test_launch_api(demo_data, tmp_path):
    work = str(tmp_path / 'w')
    rec = str(tmp_path / 'rec')
    code = ('import mmddp_ext, sys; '
            f'r = mmddp_ext.launch({recording_config(tmp_path, rec)!r}, nproc_per_node=2, '
            f'args=["--work-dir", {work!r}, *sys.argv[1:]]); print("RESULT", r)')
    out = check_ok(run([PYTHON, '-c', code, *demo_options(demo_data, 1)]))
    result = out[out.rindex('RESULT ') + len('RESULT '):].splitlines()[0]
    assert ast.literal_eval(result) == {0: 0, 1: 0}  # {local rank: return value}, any order
    assert osp.isfile(osp.join(work, 'epoch_1.pth'))
    _assert_disjoint_and_complete(read_records(rec), 2, demo_data)


def test_failing_worker_is_named_in_the_last_lines(demo_data, tmp_path):
    proc = run([
        'bash', 'tools/dist_train.sh', DEMO_CONFIG, '2', '--work-dir',
        str(tmp_path), *demo_options(
            demo_data, 1, **{'train_dataloader.dataset.ann_file': 'annotations/nope.json'})
    ])
    assert proc.returncode != 0
    tail = '\n'.join(proc.stdout.strip().splitlines()[-8:])
    assert 'ranks 0, 1' in tail  # both raised the same: no rank is called the first
    assert 'AssertionError: Annotation file' in tail and 'nope.json' in tail  # mmpose's check
    assert 'full traceback:' in tail and 'failures/rank' in tail
    assert 'error_file: <N/A>' not in proc.stdout  # @record gave torchrun the error file


def _listening(root_pid):
    import psutil
    try:
        procs = [psutil.Process(root_pid)] + psutil.Process(root_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return set()
    found = set()
    for p in procs:
        try:
            found |= {c.laddr.ip for c in p.net_connections('inet') if c.status == 'LISTEN'}
        except psutil.Error:
            pass
    return found


def test_single_node_job_listens_on_loopback_only(demo_data, tmp_path):
    """Every listening socket of a running dist_train.sh job is on 127.0.0.1."""
    proc = popen([
        'bash', 'tools/dist_train.sh', DEMO_CONFIG, '2', '--work-dir',
        str(tmp_path / 'w'), *demo_options(demo_data, 2)
    ])
    seen, deadline = set(), time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        seen |= _listening(proc.pid)
        time.sleep(0.5)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    assert seen, 'the job was never seen listening'
    assert seen <= {'127.0.0.1'}, f'listening beyond loopback: {sorted(seen)}'
