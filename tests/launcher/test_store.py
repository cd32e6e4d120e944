"""launcher/store: the store ranks started by hand or by Slurm meet through, in one process on
loopback: its bound read from the environment, a port in use named with its holder, one rank
that joins alone, and a rank that cannot reach rank 0 stopped within the bound. Two real
hand-set ranks: tests/launcher/test_rendezvous.py."""
import os
import time

import pytest

from mmddp_ext.launcher.env import DistEnv, DistEnvError
from mmddp_ext.launcher.store import check_port_free, rendezvous_store, rendezvous_timeout
from mmddp_launch import rendezvous
from mmddp_launch.rendezvous import find_free_port


@pytest.mark.parametrize('value, seconds', [(None, 300.0), ('12', 12.0), ('0.5', 0.5)])
def test_the_bound_comes_from_the_environment(monkeypatch, value, seconds):
    if value is None:
        monkeypatch.delenv('MMDDP_RENDEZVOUS_TIMEOUT', raising=False)
    else:
        monkeypatch.setenv('MMDDP_RENDEZVOUS_TIMEOUT', value)
    assert rendezvous_timeout() == seconds


def test_a_bad_bound_is_named(monkeypatch):
    monkeypatch.setenv('MMDDP_RENDEZVOUS_TIMEOUT', 'soon')
    with pytest.raises(DistEnvError, match="MMDDP_RENDEZVOUS_TIMEOUT='soon' must be a positive"):
        rendezvous_timeout()


def test_a_port_in_use_names_its_holder():
    with rendezvous.listen_on('127.0.0.1', 0) as sock:
        port = sock.getsockname()[1]
        with pytest.raises(DistEnvError) as e:
            check_port_free(port)
    assert f'MASTER_PORT={port} is already in use' in str(e.value)
    assert f'by pid {os.getpid()}' in str(e.value)
    check_port_free(port)  # free again: no error


def _env(rank, world, port):
    return DistEnv(launcher='pytorch', rank=rank, world_size=world, local_world_size=world,
                   master_addr='127.0.0.1', master_port=port)


def test_a_job_of_one_rank_meets_itself():
    store = rendezvous_store(_env(0, 1, find_free_port()), timeout=10)
    assert store.add('mmddp_ext/joined', 0) == 1


def test_a_rank_that_cannot_reach_rank_0_stops_within_the_bound(monkeypatch):
    monkeypatch.setenv('MMDDP_RENDEZVOUS_LOG_EVERY', '1')
    port = find_free_port()  # nobody listens there
    start = time.monotonic()
    with pytest.raises(DistEnvError) as e:
        rendezvous_store(_env(1, 2, port), timeout=2)
    waited = time.monotonic() - start
    assert f'rank 1 could not reach the rank-0 store at MASTER_ADDR=127.0.0.1 ' \
           f'MASTER_PORT={port} within 2 s' in str(e.value)
    assert waited >= 2  # it waited the bound it was given, not torch's 30 minutes
