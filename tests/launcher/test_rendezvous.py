"""Rendezvous failures say what is wrong, in bounded time; single-host jobs listen on loopback;
a failed worker ends with one line and a JSON launcher report. Real processes on CPU (gloo); the
front's and the rendezvous helpers in-process are in ``test_torchrun_front.py``.

Waits are set short through MMDDP_RENDEZVOUS_TIMEOUT / MMDDP_RENDEZVOUS_LOG_EVERY; the
``timeout`` of each command only stops a test that would otherwise hang."""
import json
import os
import os.path as osp
import re
import socket
import time

import psutil
import pytest
from listening import assert_loopback_only, other_hostname_prefix

from mmddp_launch import rendezvous
from mmddp_launch.rendezvous import find_free_port

from conftest import (DEMO_CONFIG, PYTHON, assert_no_debris, assert_not_trained, demo_options,
                      finish, popen, run)

HANG_GUARD = 600
TIMEOUT, LOG_EVERY = 8, 2  # the rendezvous bound and the log interval the tests set
SHORT = dict(MMDDP_RENDEZVOUS_TIMEOUT=str(TIMEOUT), MMDDP_RENDEZVOUS_LOG_EVERY=str(LOG_EVERY))
SCRIPT = ['bash', 'tools/dist_train.sh']
TRAIN = [PYTHON, 'tools/dist_train.py']


def _lines(out: str, prefix: str):
    return [ln for ln in out.splitlines() if ln.startswith(prefix)]


def _held_port():
    """A socket listening on a loopback port (the port "in use" by this test's process)."""
    sock = rendezvous.listen_on('127.0.0.1', 0)
    return sock, sock.getsockname()[1]


@pytest.mark.parametrize('name, value', [('MMDDP_RENDEZVOUS_TIMEOUT', 'abc'),
                                         ('MMDDP_RENDEZVOUS_TIMEOUT', '0'),
                                         ('MMDDP_RENDEZVOUS_LOG_EVERY', '-1')])
def test_bad_wait_settings_are_named(name, value):
    proc = run(SCRIPT + [DEMO_CONFIG, '2'], env={name: value}, timeout=HANG_GUARD)
    assert proc.returncode == 2
    assert f"{name}={value!r} must be a positive number of seconds" in proc.stdout


# ---------------------------------------------------------------- port in use (dist_train.sh)


@pytest.mark.parametrize('nodes, fix', [
    (dict(), 'leave PORT unset on a single node (a free port is picked) or choose another'),
    (dict(NNODES='2', NODE_RANK='0'), 'stop that process or choose another PORT on every node'),
], ids=['single node', 'node 0 of 2'])
def test_port_in_use_is_named_before_torchrun_starts(tmp_path, nodes, fix):
    sock, port = _held_port()
    with sock:
        proc = run(SCRIPT +
                   [DEMO_CONFIG, '2', '--work-dir', str(tmp_path)],
                   env=dict(PORT=str(port), **nodes), timeout=HANG_GUARD)
    [line] = _lines(proc.stdout, '[mmddp_ext] error:')
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert f'PORT={port} is already in use on this host' in line
    assert f'127.0.0.1:{port} by pid {os.getpid()} ({psutil.Process().name()}: ' in line
    assert fix in line and int(line.rsplit('e.g. PORT=', 1)[1]) != port
    # nothing was started: no torchrun output, no worker, no diagnosis of a run that never was
    assert 'Traceback' not in proc.stdout and 'diagnosis' not in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == line


def test_hand_set_rank_0_names_the_port_holder(tmp_path):
    sock, port = _held_port()
    with sock:
        [(rc, out)] = finish([
            popen(
                TRAIN + [DEMO_CONFIG, '--work-dir', str(tmp_path)], env=dict(
                    RANK='0', WORLD_SIZE='2', MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port), **
                    SHORT))
        ], timeout=HANG_GUARD)
    [line] = _lines(out, '[mmddp_ext] error:')
    assert rc == 1 and f'MASTER_PORT={port} is already in use' in line
    assert f'by pid {os.getpid()} (' in line and 'choose a free port for every process' in line
    suggested = int(line.rsplit('e.g. MASTER_PORT=', 1)[1].split()[0].rstrip('.,;)'))
    assert suggested != port and 0 < suggested < 65536
    assert_not_trained(out)
    assert_no_debris(tmp_path)


# ---------------------------------------------------------------- an unreachable master


def _waited(out: str, pattern: str):
    """The seconds of each waiting line matching ``pattern`` (with one ``(\\d+)`` group)."""
    return [int(m[1]) for m in re.finditer(pattern, out)]


@pytest.mark.waits
def test_unreachable_master_is_named_within_the_bound(tmp_path):
    port = find_free_port()  # nothing listens there, on 127.0.0.2 either
    start = time.monotonic()
    proc = run(
        SCRIPT + [DEMO_CONFIG, '2', '--work-dir', str(tmp_path)], timeout=HANG_GUARD,
        env=dict(NNODES='2', NODE_RANK='1', MASTER_ADDR='127.0.0.2', PORT=str(port), **SHORT))
    elapsed = time.monotonic() - start
    assert proc.returncode == 2, proc.stdout[-3000:]
    seconds = _waited(
        proc.stdout, rf'\[mmddp_ext\] node 1 waiting for node 0 at '
        rf'127\.0\.0\.2:{port} \((\d+) s\)')
    assert seconds == sorted(seconds) and len(seconds) >= TIMEOUT // LOG_EVERY - 1, proc.stdout
    [line] = _lines(proc.stdout, '[mmddp_ext] error:')
    assert f'node 1 could not reach node 0 at MASTER_ADDR=127.0.0.2 PORT={port} within ' \
           f'{TIMEOUT} s' in line
    for cause in ('wrong MASTER_ADDR', 'node 0 not started', 'different PORT', 'firewall'):
        assert cause in line
    assert elapsed >= TIMEOUT  # it did wait the configured bound (and not torch's 900 s)
    assert 'Traceback' not in proc.stdout and proc.stdout.strip().splitlines()[-1] == line


@pytest.mark.waits
def test_node_0_alone_says_the_other_nodes_did_not_join(tmp_path):
    port = find_free_port()
    proc = run(SCRIPT +
               [DEMO_CONFIG, '1', '--work-dir', str(tmp_path)], timeout=HANG_GUARD,
               env=dict(NNODES='2', NODE_RANK='0', PORT=str(port), **SHORT))
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert _waited(
        proc.stdout, r'node 0 waiting for the other nodes \(NNODES=2\) at '
        rf'127\.0\.0\.1:{port} \((\d+) s\)'), proc.stdout
    [line] = _lines(proc.stdout, '[mmddp_ext] error:')
    assert f'node 0 did not complete the rendezvous at 127.0.0.1:{port} within {TIMEOUT} s' \
        in line and f'PORT={port}' in line and '1/2 clients joined' in line  # torchrun's words
    assert 'Traceback' not in proc.stdout


@pytest.mark.parametrize('rank, pattern, error', [
    (1, r'rank 1 waiting for rank 0 at 127\.0\.0\.1:{port} \((\d+) s\)',
     'rank 1 could not reach the rank-0 store at MASTER_ADDR=127.0.0.1 MASTER_PORT={port} within'
     ' {timeout} s'),
    (0, r'rank 0 waiting at 127\.0\.0\.1:{port}: 1 of WORLD_SIZE=2 processes joined \((\d+) s\)',
     'only 1 of WORLD_SIZE=2 processes joined at MASTER_ADDR=127.0.0.1 MASTER_PORT={port} within'
     ' {timeout} s'),
], ids=['rank 1 without rank 0', 'rank 0 without rank 1'])
@pytest.mark.waits
def test_hand_set_ranks_say_what_they_wait_for(tmp_path, rank, pattern, error):
    port = find_free_port()
    [(rc, out)] = finish([
        popen(
            TRAIN + [DEMO_CONFIG, '--work-dir', str(tmp_path)], env=dict(
                RANK=str(rank), WORLD_SIZE='2', MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port), **
                SHORT))
    ], timeout=HANG_GUARD)
    assert rc == 1, out[-3000:]
    assert _waited(out, pattern.format(port=port)), out[-3000:]
    [line] = _lines(out, '[mmddp_ext] error:')
    # it gave up after the configured wait, not torch's default of 30 minutes (or ours, 300 s)
    assert error.format(port=port, timeout=TIMEOUT) in line
    assert_not_trained(out)
    assert_no_debris(tmp_path)


# ---------------------------------------------------------------- loopback means loopback


@pytest.fixture(scope='module')
def other_hostname(tmp_path_factory):
    """A command prefix under which this machine's host name resolves beyond loopback
    (``listening.other_hostname_prefix``); the test is skipped where it cannot."""
    prefix, why_not = other_hostname_prefix(str(tmp_path_factory.mktemp('hosts')))
    if prefix is None:
        pytest.skip(why_not)
    return prefix


def test_dist_train_sh_listens_on_loopback_only(healthy_run):
    """The shared healthy run (``conftest.healthy_run``), under a host name that resolves to a
    non-loopback address where the machine allows it: every socket it listened on, read at
    every line it printed, is on 127.0.0.1."""
    if not healthy_run.hostname:
        pytest.skip(healthy_run.why_not)
    assert_loopback_only(healthy_run.seen, [(healthy_run.returncode, healthy_run.out)])
    name = rendezvous.loopback_ifname()
    assert healthy_run.out.count(f'single-host job: GLOO_SOCKET_IFNAME={name} '
                                 f'NCCL_SOCKET_IFNAME={name}') == 1  # logged once, by the front


# ---------------------------------------------------------------- one screen for a failure


def _kill_config(tmp_path) -> str:
    path = osp.join(str(tmp_path), 'demo_kill.py')
    with open(path, 'w') as f:
        f.write(f"_base_ = [{DEMO_CONFIG!r}]\ncustom_imports = dict(imports=['mmddp_ext', "
                "'tests.helpers.kill_rank'], allow_failed_imports=False)\n")
    return path


@pytest.mark.slow
def test_killed_rank_gives_one_line_and_a_launcher_report(demo_data, tmp_path):
    report = str(tmp_path / 'launch.json')
    start = time.time()
    proc = run(
        SCRIPT + [
            _kill_config(tmp_path), '2', '--work-dir',
            str(tmp_path / 'w'), *demo_options(demo_data, 1)
        ], timeout=HANG_GUARD, env=dict(MMDDP_TEST_KILL_RANK='1', MMDDP_LAUNCH_REPORT=report))
    assert proc.returncode == 1, proc.stdout[-3000:]
    records = json.load(open(report))
    first = records[0]
    assert {r['rank'] for r in records} <= {0, 1}
    assert all(
        set(r) == {'rank', 'local_rank', 'pid', 'exitcode', 'signal', 'host', 'time', 'error_file'}
        for r in records)
    assert (first['rank'], first['local_rank'], first['exitcode'], first['signal']) == \
        (1, 1, -9, 'SIGKILL')
    assert first['host'] == socket.gethostname() and first['error_file'] is None
    assert int(start) <= first['time'] <= time.time()
    tail = proc.stdout.strip().splitlines()[-25:]
    assert (f'[mmddp_ext] torchrun: rank 1 (pid {first["pid"]}) exited with signal SIGKILL'
            in '\n'.join(tail)), '\n'.join(tail)
    assert 'Root Cause' not in proc.stdout and 'ChildFailedError' not in proc.stdout
    assert not any(ln.startswith('Traceback') for ln in tail)


def test_front_does_not_import_the_package(tmp_path):
    """The agent process runs torchrun only: no mmddp_ext, no MMEngine (``-X importtime``);
    a single node with a chosen port uses that port, on loopback."""
    script = tmp_path / 'noop.py'
    script.write_text('import os; print("worker ran at", os.environ["MASTER_ADDR"], '
                      'os.environ["MASTER_PORT"], os.environ["GLOO_SOCKET_IFNAME"])\n')
    port = find_free_port()
    proc = run([
        PYTHON, '-X', 'importtime', 'mmddp_ext/launcher/torchrun_front.py', f'--master-port={port}',
        '--nproc_per_node=1',
        str(script)
    ], timeout=HANG_GUARD)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert f'worker ran at 127.0.0.1 {port} {rendezvous.loopback_ifname()}' in proc.stdout
    imported = [
        ln.rsplit('|', 1)[-1].strip() for ln in proc.stdout.splitlines()
        if ln.startswith('import time:')
    ]
    assert 'torch.distributed.run' in imported
    assert not [m for m in imported if m.split('.')[0] in ('mmddp_ext', 'mmengine')]
