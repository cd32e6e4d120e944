"""The rendezvous helpers (:mod:`mmddp_launch.rendezvous`) and the torchrun front's failure
records (:mod:`mmddp_ext.launcher.torchrun_front`), in-process: who holds a port, pinning
gloo/NCCL to the loopback interface, waiting with progress lines, torchrun's failures as
records and one line. The front run for real is in ``test_rendezvous.py``."""
import os
import re
import socket

import psutil
import pytest

from mmddp_ext.launcher import torchrun_front
from mmddp_launch import rendezvous


def test_port_holder_names_the_listening_process():
    sock = rendezvous.listen_on('127.0.0.1', 0)  # the port "in use" by this test's process
    port = sock.getsockname()[1]
    with sock:
        holder = rendezvous.port_holder(port)
        line = rendezvous.port_in_use_message('PORT', port, 'choose another')
    assert holder.startswith(f'127.0.0.1:{port} by pid {os.getpid()} (')
    assert f'PORT={port} is already in use on this host ({socket.gethostname()}) at {holder}' \
        in line
    assert int(line.rsplit('e.g. PORT=', 1)[1]) != port


def test_loopback_interfaces_are_pinned_only_where_unset():
    name = rendezvous.loopback_ifname()
    if name is None:
        pytest.skip('no interface holds a 127.x address on this host')
    assert any(a.address == '127.0.0.1' for a in psutil.net_if_addrs()[name])
    environ = {}
    note = rendezvous.pin_loopback_interfaces(environ)
    assert environ == dict(GLOO_SOCKET_IFNAME=name, NCCL_SOCKET_IFNAME=name)
    assert f'GLOO_SOCKET_IFNAME={name} NCCL_SOCKET_IFNAME={name}' in note
    chosen = dict(GLOO_SOCKET_IFNAME='eth7')  # the user's choice is kept
    rendezvous.pin_loopback_interfaces(chosen)
    assert chosen == dict(GLOO_SOCKET_IFNAME='eth7', NCCL_SOCKET_IFNAME=name)
    both = dict(GLOO_SOCKET_IFNAME='a', NCCL_SOCKET_IFNAME='b')
    assert rendezvous.pin_loopback_interfaces(both) is None and both['NCCL_SOCKET_IFNAME'] == 'b'


def test_failure_records_first_seen_first():
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    # the agent inserts the failure it saw first; the rank it stopped itself comes after it,
    # within the same second
    failures = {
        1: ProcessFailure(1, 4001, -9, '/nonexistent/error.json'),
        0: ProcessFailure(0, 4000, -15, '/nonexistent/error.json')
    }
    failures[0].timestamp = failures[1].timestamp
    records = torchrun_front.failure_records(failures)
    assert [r['rank'] for r in records] == [1, 0]
    assert records[0] == dict(rank=1, local_rank=1, pid=4001, exitcode=-9, signal='SIGKILL',
                              host=socket.gethostname(), time=failures[1].timestamp,
                              error_file=None)
    assert torchrun_front.failure_line(records, 'diagnosis below') == (
        'torchrun: rank 1 (pid 4001) exited with signal SIGKILL (first of 2 failed ranks); '
        'diagnosis below')
    exited = torchrun_front.failure_records({3: ProcessFailure(1, 7, 1, '/nonexistent')})
    assert exited[0]['signal'] is None
    assert 'exited with exit code 1;' in torchrun_front.failure_line(exited, 'x')


def test_wait_until_returns_the_first_answer_and_logs_while_it_waits(capsys):
    answers = iter([None, None, None, 'ready'])
    assert rendezvous.wait_until(lambda: next(answers), 10.0, 0.01, lambda s: f'waiting {s >= 0}',
                                 interval=0.02) == 'ready'
    lines = capsys.readouterr().err.splitlines()
    assert 1 <= len(lines) <= 3 and set(lines) == {'[mmddp_ext] waiting True'}


def test_wait_until_gives_up_at_the_timeout_with_none(capsys):
    calls = []
    assert rendezvous.wait_until(lambda: calls.append(1), 0.1, 100.0, str, interval=0.01) is None
    assert len(calls) >= 2 and capsys.readouterr().err == ''  # asked again; nothing logged yet


def test_wait_for_listener_names_why_nothing_answered():
    sock = rendezvous.listen_on('127.0.0.1', 0)
    port = sock.getsockname()[1]
    assert rendezvous.wait_for_listener('127.0.0.1', port, 5.0, 100.0, str) is None
    sock.close()  # nobody listens there now
    assert rendezvous.wait_for_listener('127.0.0.1', port, 0.2, 100.0, str) == 'connection refused'
    assert 'does not resolve' in rendezvous.wait_for_listener('no-such-host.invalid', port, 5.0,
                                                              100.0, str)


@pytest.mark.parametrize(
    'environ, nnodes, node_rank, nproc, wrong',
    [
        ({}, 1, 0, 2, None),  # no operator
        (dict(WORLD_SIZE='2', RANK='1'), 2, 1, 1, None),  # PyTorchJob, 1 process per pod
        (dict(WORLD_SIZE='2', RANK='1'), 2, 1, 4, None),  # older operators: WORLD_SIZE = pods
        (dict(WORLD_SIZE='8', RANK='1'), 2, 1, 4, None),  # newer ones: pods × processes per pod
        # the pods' WORLD_SIZE with each pod a job of its own (dist_train.sh CFG 1, no NNODES)
        (dict(WORLD_SIZE='2', RANK='1'), 1, 0, 1, 'WORLD_SIZE=2 is set in this environment'),
        (dict(WORLD_SIZE='4', RANK='0'), 2, 0, 1, 'NNODES=2 × 1 processes per node'),
        (dict(WORLD_SIZE='2', RANK='1'), 2, 0, 1, 'RANK=1 is set in this environment'),
    ])
def test_operator_layout_error(environ, nnodes, node_rank, nproc, wrong):
    from mmddp_launch import kubeflow
    line = kubeflow.layout_error(environ, nnodes, node_rank, nproc)
    if wrong is None:
        assert line is None
    else:
        assert wrong in line and 'NNODES=<number of pods>' in line and 'PET_NNODES' in line


@pytest.mark.parametrize(
    'environ, given, expected, noted',
    [
        ({}, ('', '', ''), ('', '', ''), False),  # dist_train.sh's defaults follow
        (dict(PET_NNODES='2', PET_NODE_RANK='1', MASTER_PORT='23456'), ('', '', ''),
         ('2', '1', '23456'), True),  # a PyTorchJob pod
        (dict(PET_NNODES='2', PET_NODE_RANK='1'), ('4', '3', ''), ('4', '3', ''), False),  # yours
        (dict(MASTER_PORT='23456'), ('2', '0', ''), ('2', '0', '23456'), False),  # operator's port
        (dict(MASTER_PORT='23456'), ('1', '0', ''), ('1', '0', ''), False),  # one node: a free one
    ])
def test_the_operators_layout_fills_what_the_user_left_unset(environ, given, expected, noted):
    from mmddp_launch import kubeflow
    *got, note = kubeflow.node_layout(environ, *given)
    assert tuple(got) == expected and bool(note) == noted


@pytest.mark.parametrize('given, line', [
    (['--nnodes=two'], "NNODES='two' must be a whole number"),
    (['--nnodes=0'], 'NNODES=0 must be at least 1'),
    (['--nnodes=2', '--node-rank=2'], 'NODE_RANK=2 is out of range for NNODES=2 (0..1)'),
    (['--master-port=x'], "PORT='x' must be a whole number"),
])
def test_a_bad_layout_is_one_line(given, line):
    from mmddp_ext.launcher.torchrun_front import split_args
    with pytest.raises(ValueError, match=re.escape(line)):
        split_args(given, {})


def test_the_front_fills_the_defaults():
    from mmddp_ext.launcher.torchrun_front import split_args
    opts, rest = split_args([
        '--nnodes=', '--node-rank=', '--master-addr=', '--master-port=', '--nproc_per_node=2',
        'train.py'
    ], {})
    assert opts == dict(nnodes='1', node_rank='0', master_addr='127.0.0.1', master_port=None)
    assert rest == ['--nproc_per_node=2', 'train.py']


def test_nproc_among_torchruns_arguments():
    from mmddp_ext.launcher.torchrun_front import _nproc
    assert _nproc(['--nproc_per_node=4', '--max-restarts=0', 'x.py']) == 4
    assert _nproc(['--nproc-per-node=2']) == 2 and _nproc(['x.py']) == 1
