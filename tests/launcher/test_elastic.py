"""Real multi-process launches on CPU (gloo): dist_train.sh, by hand, multi-node, launch()."""
import ast
import json
import math
import os
import os.path as osp
import re
import signal
import subprocess
import uuid

import psutil
import pytest
from listening import assert_loopback_only, finish_watching_sockets, other_hostname_prefix

from mmddp_launch.rendezvous import find_free_port

from conftest import (DEMO_CONFIG, PYTHON, ROOT, demo_options, demo_with_hooks, finish, popen,
                      read_records, recording_config, run)

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


def test_dist_train_sh_two_processes(healthy_run, demo_data):
    """The shared healthy run (``conftest.healthy_run``): ``dist_train.sh CFG 2``."""
    records = read_records(healthy_run.records)
    for rank, r in records.items():
        assert r['dist_world'] == 2
        assert r['env']['RANK'] == r['env']['LOCAL_RANK'] == str(rank)
        # the entry's start-up (mmddp_launch.start_up): collector on, the runner frozen
        assert r['gc'] == dict(enabled=True, runner_frozen=True)
    _assert_disjoint_and_complete(records, 2, demo_data)
    assert 'process group: gloo' in healthy_run.out and 'RANK 0 of WORLD_SIZE 2' in healthy_run.out
    assert osp.isfile(osp.join(healthy_run.work, 'epoch_1.pth'))


def test_two_jobs_at_once_on_one_machine(two_jobs):
    """Without PORT each job gets its own free port: neither clashes with the other (the
    shared pair of jobs, ``shared_runs.two_jobs``)."""
    for rc, out, work in two_jobs:
        assert rc == 0, out[-4000:]
        assert osp.isfile(osp.join(work, 'epoch_1.pth'))
    # each job's rank 0 says where its store listens: two different ports
    ports = [
        re.findall(r'RANK 0 of WORLD_SIZE 2 .*; master 127\.0\.0\.1:(\d+);', out)
        for _, out, _ in two_jobs
    ]
    assert len(ports[0]) == len(ports[1]) == 1 and ports[0] != ports[1], ports


@pytest.fixture(scope='module')
def hostname_prefix(tmp_path_factory):
    """A command prefix under which the host name resolves beyond loopback, where the machine
    allows it (``listening.other_hostname_prefix``); else none: the job then listens on
    loopback by default, and the check of that is weaker."""
    prefix, _ = other_hostname_prefix(str(tmp_path_factory.mktemp('hosts')))
    return prefix or []


def test_manual_env_launch_without_local_rank(hostname_prefix, demo_data, tmp_path):
    """Two processes with hand-set RANK/WORLD_SIZE/MASTER_* (no LOCAL_RANK, no thread count):
    they derive the rest, share the cores, read disjoint halves of the data, and listen on
    loopback only (rank 0 logs the interface once)."""
    rec = str(tmp_path / 'rec')
    cfg = recording_config(tmp_path, rec)
    port = str(find_free_port())
    procs = [
        popen(
            hostname_prefix + [
                PYTHON, 'tools/dist_train.py', cfg, '--work-dir',
                str(tmp_path / 'w'), *demo_options(demo_data, 1)
            ], env=dict(
                RANK=str(r), WORLD_SIZE='2', MASTER_ADDR='127.0.0.1', MASTER_PORT=port,
                OMP_NUM_THREADS='')) for r in range(2)
    ]
    results, seen = finish_watching_sockets(procs)
    assert_loopback_only(seen, results)
    assert results[0][1].count('single-host job: GLOO_SOCKET_IFNAME=') == 1  # rank 0 only
    assert 'single-host job' not in results[1][1]
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
    """``NNODES=2 NODE_RANK=n MASTER_ADDR=... PORT=... dist_train.sh CFG 2`` on each "node"
    (two agents on loopback): 4 ranks, world size = nodes × processes, rank = node × 2 + local
    rank, the data split four ways, and both nodes train to the end."""
    rec = str(tmp_path / 'rec')
    cfg = recording_config(tmp_path, rec)
    port = str(find_free_port())
    procs = [
        popen([
            'bash', 'tools/dist_train.sh', cfg, '2', '--work-dir',
            str(tmp_path / 'w'), *demo_options(demo_data, 1)
        ], env=dict(NNODES='2', NODE_RANK=str(n), MASTER_ADDR='127.0.0.1', PORT=port))
        for n in range(2)
    ]
    for rc, out in finish(procs):
        assert rc == 0, out[-4000:]
    records = read_records(rec)
    for rank, r in records.items():
        env = {k: int(v) for k, v in r['env'].items() if v is not None}
        assert env['WORLD_SIZE'] == 4 == 2 * env['LOCAL_WORLD_SIZE']  # nnodes × nproc
        assert env['RANK'] == rank == env['GROUP_RANK'] * 2 + env['LOCAL_RANK']
    assert {(r['env']['GROUP_RANK'], r['env']['LOCAL_RANK']) for r in records.values()} == \
        {('0', '0'), ('0', '1'), ('1', '0'), ('1', '1')}
    _assert_disjoint_and_complete(records, 4, demo_data)


# the demo config's own DataLoader workers (2 per loader, persistent), which demo_options turns off
OWN_WORKERS = {
    f'{loader}.{key}': value
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader')
    for key, value in (('num_workers', '2'), ('persistent_workers', 'True'))
}
LAUNCH_BOUND = 300  # seconds: a launch that never returns is killed here, and the test fails


def _job_processes(marker: str) -> list:
    """The live processes started with ``MMDDP_TEST_JOB=marker`` in their environment: the
    caller, the ranks and their DataLoader workers inherit it."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get('MMDDP_TEST_JOB') == marker and proc.status() != 'zombie':
                found.append(f'{proc.pid} {" ".join(proc.cmdline())[:120]}')
        except psutil.Error:  # gone meanwhile, or not ours to read
            pass
    return found


def _launch_from_python(code: str, args, env, hostname_prefix=(), script: str = ''):
    """Run ``code`` (or the file ``script``), which calls ``mmddp_ext.launch``, in a new Python
    process under a job marker; ``(results, listening sockets)``, failing the test if the call
    does not return within :data:`LAUNCH_BOUND` or leaves a process of the job behind."""
    marker = uuid.uuid4().hex
    program = [script] if script else ['-c', code]
    proc = popen([*hostname_prefix, PYTHON, *program, *args], env=dict(env, MMDDP_TEST_JOB=marker))
    try:
        results, seen = finish_watching_sockets([proc], timeout=LAUNCH_BOUND)
    except subprocess.TimeoutExpired:
        left = _job_processes(marker)
        for pid in (int(line.split()[0]) for line in left):
            os.kill(pid, signal.SIGKILL)
        pytest.fail(f'mmddp_ext.launch() did not return within {LAUNCH_BOUND} s; '
                    f'processes of the job: {left}')
    assert _job_processes(marker) == [], 'processes of the job left behind'
    return results, seen


def _result_line(out: str) -> str:
    return out[out.rindex('RESULT ') + len('RESULT '):].splitlines()[0]


def test_launch_api(hostname_prefix, demo_data, tmp_path):
    """``mmddp_ext.launch()`` from Python, given a Config object and ``max_restarts=1``, with
    the demo config's own DataLoader workers (2, persistent): rank 1 is killed in the agent's
    first attempt (``tests.helpers.kill_rank``), the agent restarts the workers once, and then
    every worker returns 0 and the call returns, with no process of the job left; the caller's
    environment is as it was, the data is split, the job listens on loopback only, and the
    config file dumped for the workers is removed."""
    work = str(tmp_path / 'w')
    rec = str(tmp_path / 'rec')
    tmp = tmp_path / 'tmp'
    tmp.mkdir()
    # an mmengine.Config object, as the docstring allows (dumped to a file for the workers)
    code = ('import os, sys, mmddp_ext; from mmengine import Config; '
            f'cfg = Config.fromfile({recording_config(tmp_path, rec)!r}); '
            "cfg.custom_imports.imports.append('tests.helpers.kill_rank'); "
            'r = mmddp_ext.launch(cfg, nproc_per_node=2, max_restarts=1, '
            f'args=["--work-dir", {work!r}, *sys.argv[1:]]); '
            'print("RESULT", r, "|", "GLOO_SOCKET_IFNAME" in os.environ)')
    results, seen = _launch_from_python(
        code, demo_options(demo_data, 1, **OWN_WORKERS),
        dict(MMDDP_TEST_KILL_RANK='1', MMDDP_TEST_KILL_ATTEMPT='0', TMPDIR=str(tmp)),
        hostname_prefix)
    assert_loopback_only(seen, results)
    result, env_changed = _result_line(results[0][1]).split(' | ')
    assert ast.literal_eval(result) == {0: 0, 1: 0}  # {local rank: return value}, any order
    assert env_changed == 'False'
    assert not list(tmp.glob('mmddp_launch_*.py'))  # the config file dumped for the workers
    assert osp.isfile(osp.join(work, 'epoch_1.pth'))
    records = read_records(rec)
    # the first attempt failed (rank 1 killed): the ranks that trained are the agent's restart
    assert {r['env']['TORCHELASTIC_RESTART_COUNT'] for r in records.values()} == {'1'}
    _assert_disjoint_and_complete(records, 2, demo_data)
    for r in records.values():  # they loaded with the config's own workers, alive at the end
        assert r['num_workers'] == 2 and r['live_workers'] >= 2, r


def _from_python_example() -> str:
    """The Python block of docs/launching.md's '5. From Python', as written."""
    with open(osp.join(ROOT, 'docs', 'launching.md')) as f:
        text = f.read()
    start = text.index('```python\n', text.index('**5. From Python**')) + len('```python\n')
    return text[start:text.index('\n```', start)]


def test_the_docs_from_python_example_runs_as_written(demo_data, tmp_path):
    """docs/launching.md's example, saved as a script and run as the docs say (options after
    it: the test data, one epoch, another work_dir), with the demo config's own DataLoader
    workers: it prints each rank's 0 and returns, with no process of the job left behind."""
    script = tmp_path / 'train_demo.py'
    script.write_text(_from_python_example())
    work = str(tmp_path / 'w')
    results, _ = _launch_from_python(
        '', ['--work-dir', work, *demo_options(demo_data, 1, **OWN_WORKERS)], {},
        script=str(script))
    rc, out = results[0]
    assert rc == 0, out[-4000:]
    assert ast.literal_eval(out.strip().splitlines()[-1]) == {0: 0, 1: 0}
    assert osp.isfile(osp.join(work, 'epoch_1.pth'))


def test_launch_api_failing_rank_with_workers(demo_data, tmp_path):
    """A rank that raises at iteration 2, with the demo's own DataLoader workers alive on every
    rank: ``launch()`` raises LaunchFailed, torch's ChildFailedError with the rank at fault named
    (torch's agent reports whichever rank it saw end first: the one that raised, or its peer
    that lost it), and no process of the job is left behind."""
    cfg = demo_with_hooks(tmp_path, "dict(type='FaultHook', rank=1, at_iter=2, fault='raise')",
                          ['fault_hook'])
    code = ('import sys, mmddp_ext\n'
            'from torch.distributed.elastic.multiprocessing.errors import ChildFailedError\n'
            'try:\n'
            f'    mmddp_ext.launch({cfg!r}, nproc_per_node=2, args=["--work-dir", '
            f'{str(tmp_path / "w")!r}, *sys.argv[1:]])\n'
            'except ChildFailedError as e:\n'
            '    print(str(e))\n'
            '    print("RESULT", (e.rank_at_fault, {r: f.exitcode for r, f in '
            'e.failures.items()}))\n')
    results, _ = _launch_from_python(code, demo_options(demo_data, 1, **OWN_WORKERS), {})
    out = results[0][1]
    assert results[0][0] == 0, out[-4000:]
    at_fault, codes = ast.literal_eval(_result_line(out))
    assert at_fault == 1, out[-4000:]  # the rank that raised, whichever torch saw first
    assert codes and all(code != 0 for code in codes.values()), codes
    assert 'rank 1 failed first; ==== mmddp_ext diagnosis of' in out
    assert 'first failing rank: 1' in out
    assert 'injected fault on rank 1 at iteration 2' in out
    assert 'failed (what this rank sees)' not in out  # one screen: launch()'s


def test_failing_worker_is_named_in_the_last_lines(demo_data, tmp_path):
    """Both ranks raise (a missing annotation file, its data_root relative to the working
    directory, as the demo config's): the last lines name both, the error, the whole relative
    path and the fix for a missing file (docs/launching.md's sample screen), never our runner as
    "your code"; torchrun's report is not "<N/A>", the JSON launcher report points at the error
    file the worker's @record wrote, and dist_train.sh removes its temporary folder."""
    report, tmp = str(tmp_path / 'launch.json'), tmp_path / 'tmp'
    tmp.mkdir()
    root = osp.relpath(demo_data, ROOT) + '/'
    proc = run([
        'bash', 'tools/dist_train.sh', DEMO_CONFIG, '2', '--work-dir',
        str(tmp_path / 'w'), *demo_options(
            demo_data, 1, **{
                'train_dataloader.dataset.data_root': root,
                'train_dataloader.dataset.ann_file': 'annotations/nope.json'
            })
    ], env=dict(MMDDP_LAUNCH_REPORT=report, TMPDIR=str(tmp)))
    assert proc.returncode == 1
    tail = '\n'.join(proc.stdout.strip().splitlines()[-10:])
    assert 'ranks 0, 1' in tail  # both raised the same: no rank is called the first
    assert 'AssertionError: Annotation file' in tail and 'nope.json' in tail  # mmpose's check
    assert f'  input file: {root}annotations/nope.json (rank ' in tail
    assert (f"  fix: no such file on this node (a relative path: read from the rank's working "
            f"directory {ROOT}): check the path in the config") in tail
    assert 'your code' not in tail and 'corrupt' not in tail
    assert 'full traceback:' in tail and 'failures/rank' in tail
    assert 'error_file: <N/A>' not in proc.stdout  # @record gave torchrun the error file
    records = json.load(open(report))
    first = records[0]  # the other rank raised too, or was stopped by torchrun (SIGTERM)
    assert first['exitcode'] == 1 and first['signal'] is None, records
    with open(first['error_file']) as f:  # written by the worker's @record
        assert 'nope.json' in f.read()
    assert f'torchrun: rank {first["rank"]} (pid {first["pid"]}) exited with exit code 1' \
        in proc.stdout
    assert not list(tmp.glob('mmddp_launch.*'))  # dist_train.sh removed its temporary folder


def test_two_pytorchjob_pods_on_loopback(demo_data, tmp_path):
    """Two "pods" as Kubeflow's PyTorchJob starts them (the operator's WORLD_SIZE (pods), RANK
    (the pod's index), MASTER_ADDR, MASTER_PORT, PET_NNODES, PET_NODE_RANK), each running
    ``bash tools/dist_train.sh CFG 1``: one job of 2 ranks, the pods its nodes, the data split.
    The same pods with the operator's WORLD_SIZE but no PET_* variables: each would be a job of
    its own, and each stops before starting anything with the line that names the mix."""
    rec = str(tmp_path / 'rec')
    cfg = recording_config(tmp_path, rec)
    port = str(find_free_port())

    def pod(n: int, **pet):
        return popen([
            'bash', 'tools/dist_train.sh', cfg, '1', '--work-dir',
            str(tmp_path / 'w'), *demo_options(demo_data, 1)
        ], env=dict(WORLD_SIZE='2', RANK=str(n), MASTER_ADDR='127.0.0.1', MASTER_PORT=port, **pet))

    for rc, out in finish([pod(n, PET_NNODES='2', PET_NODE_RANK=str(n)) for n in range(2)]):
        assert rc == 0, out[-4000:]
        assert 'NNODES=2 NODE_RANK=' in out and 'from PET_NNODES/PET_NODE_RANK' in out
    records = read_records(rec)
    assert {r['env']['GROUP_RANK'] for r in records.values()} == {'0', '1'}
    assert all(r['env']['WORLD_SIZE'] == '2' for r in records.values())
    _assert_disjoint_and_complete(records, 2, demo_data)
    for rc, out in finish([pod(n) for n in range(2)]):
        assert rc == 2, out[-4000:]
        assert 'WORLD_SIZE=2 is set in this environment' in out and 'NNODES=1' in out
        assert 'Epoch(train)' not in out
