"""The store a rank meets the others through: rank 0 hosts a TCP store, bounded by
``MMDDP_RENDEZVOUS_TIMEOUT``, with a message naming MASTER_ADDR/MASTER_PORT/WORLD_SIZE and the
fix for each way it fails (:func:`rendezvous_store`); under torchrun, a client of the agent's
store, one namespace per restart (:func:`agent_store`). docs/launching.md, 'Mistakes
and what they print'.
"""
import os
from datetime import timedelta
from typing import Optional

import torch.distributed as dist

from mmddp_launch.rendezvous import (DEFAULT_LOG_EVERY, DEFAULT_TIMEOUT, LOG_EVERY_ENV, TIMEOUT_ENV,
                                     is_loopback, listen_on, port_free, port_in_use_message,
                                     seconds_from_env, unreachable_causes, wait_for_listener,
                                     wait_until)

from .env import DistEnv, DistEnvError

RENDEZVOUS_TIMEOUT_ENV = TIMEOUT_ENV
DEFAULT_RENDEZVOUS_TIMEOUT = DEFAULT_TIMEOUT


def rendezvous_timeout() -> float:
    """Seconds to wait for all ranks to meet (env ``MMDDP_RENDEZVOUS_TIMEOUT``, default 300)."""
    return _seconds(RENDEZVOUS_TIMEOUT_ENV, DEFAULT_RENDEZVOUS_TIMEOUT)


def _seconds(name: str, default: float) -> float:
    try:
        return seconds_from_env(os.environ, name, default)
    except ValueError as e:
        raise DistEnvError(str(e)) from None


def check_port_free(port: int) -> None:
    """Raise DistEnvError when ``port`` is already bound on this host (rank 0 only); the message
    names the process holding it where this user can see it."""
    if not port_free(port):
        raise DistEnvError(
            port_in_use_message('MASTER_PORT', port, 'choose a free port for every process'))


def open_store(env: DistEnv, timeout: float):
    """Rank 0: host the TCP store (on 127.0.0.1 only when MASTER_ADDR is a loopback address).
    Other ranks: wait for it (saying so every MMDDP_RENDEZVOUS_LOG_EVERY seconds), then join."""
    where = f'MASTER_ADDR={env.master_addr} MASTER_PORT={env.master_port}'
    kwargs = dict(timeout=timedelta(seconds=timeout), wait_for_workers=False)
    if env.rank == 0 and is_loopback(env.master_addr):
        host = '127.0.0.1' if env.master_addr == 'localhost' else env.master_addr
        try:
            sock = listen_on(host, env.master_port)
        except OSError:
            check_port_free(env.master_port)  # names the holder
            raise
        return dist.TCPStore(host, env.master_port, env.world_size, True,
                             master_listen_fd=sock.detach(), **kwargs)
    if env.rank == 0:
        check_port_free(env.master_port)
        return dist.TCPStore(env.master_addr, env.master_port, env.world_size, True, **kwargs)
    error = wait_for_listener(
        env.master_addr, env.master_port, timeout, _seconds(LOG_EVERY_ENV, DEFAULT_LOG_EVERY),
        lambda s: (f'rank {env.rank} waiting for rank 0 at {env.master_addr}:'
                   f'{env.master_port} ({s:.0f} s)'))
    if error is not None:
        raise DistEnvError(
            f'rank {env.rank} could not reach the rank-0 store at {where} within {timeout:.0f} '
            f's ({error}; {RENDEZVOUS_TIMEOUT_ENV} sets the wait): '
            f'{unreachable_causes("rank 0", "MASTER_PORT")}')
    return dist.TCPStore(env.master_addr, env.master_port, env.world_size, False, **kwargs)


def rendezvous_store(env: DistEnv, timeout: float):
    """Open the TCP store (rank 0 hosts it) and wait until all ranks have joined."""
    where = f'MASTER_ADDR={env.master_addr} MASTER_PORT={env.master_port}'
    try:
        store = open_store(env, timeout)
    except DistEnvError:
        raise
    except Exception as e:  # DistNetworkError / RuntimeError, depending on torch
        if env.rank == 0:
            raise DistEnvError(f'rank 0 could not open the rendezvous store at {where}: '
                               f'{str(e).splitlines()[0]}') from e
        raise DistEnvError(
            f'rank {env.rank} reached the rank-0 store at {where} but could not join it within '
            f'{timeout:.0f} s ({RENDEZVOUS_TIMEOUT_ENV} sets the wait): '
            f'{str(e).splitlines()[0]}') from e
    joined = [0]

    def all_joined() -> Optional[bool]:
        joined[0] = store.add('mmddp_ext/joined', 0)
        return True if joined[0] >= env.world_size else None

    try:
        store.add('mmddp_ext/joined', 1)
        if not wait_until(
                all_joined, timeout, _seconds(LOG_EVERY_ENV, DEFAULT_LOG_EVERY),
                lambda s: f'rank {env.rank} waiting at {env.master_addr}:{env.master_port}: '
                f'{joined[0]} of WORLD_SIZE={env.world_size} processes joined ({s:.0f} s)',
                interval=0.05):
            raise DistEnvError(
                f'only {joined[0]} of WORLD_SIZE={env.world_size} processes joined at {where} '
                f'within {timeout:.0f} s: start the missing ranks, or set WORLD_SIZE to the '
                'number of processes you start')
    except DistEnvError:
        raise
    except Exception as e:
        raise DistEnvError(f'rank {env.rank} lost the rendezvous store at {where} (did rank 0 '
                           f'stop? see its error): {str(e).splitlines()[0]}') from e
    return store


def agent_store(env: DistEnv):
    """A client of the torchrun agent's store, namespaced by restart attempt.

    torchrun's static rendezvous keeps one store across restarts and torch's ``env://`` adds no
    per-attempt prefix, so restarted workers would read the dead workers' gloo addresses
    ("Connection refused"). Keys of attempt N live under ``mmddp_ext/attempt_N/``.
    """
    store = dist.TCPStore(env.master_addr, env.master_port, env.world_size, is_master=False,
                          timeout=timedelta(seconds=rendezvous_timeout()))
    attempt = os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')
    return dist.PrefixStore(f'mmddp_ext/attempt_{attempt}/', store)
