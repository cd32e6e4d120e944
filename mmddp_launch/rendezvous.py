"""The rendezvous checks shared by the torchrun front (:mod:`.torchrun_front`) and by ranks started
by hand or by Slurm (:mod:`.store`): ports (free, held by whom, bound once), the loopback
store and interfaces of a one-host job, the wait for a master with progress lines, and the
timeouts read from the environment. Standard library and psutil only (torch imported where a
store is made), so the front can load it without the package. docs/launching.md says what
each check reports.
"""
import ipaddress
import math
import socket
import sys
import time
from datetime import timedelta
from typing import Callable, Mapping, MutableMapping, Optional, TypeVar

import psutil

T = TypeVar('T')

TIMEOUT_ENV = 'MMDDP_RENDEZVOUS_TIMEOUT'
LOG_EVERY_ENV = 'MMDDP_RENDEZVOUS_LOG_EVERY'
DEFAULT_TIMEOUT = 300.0
DEFAULT_LOG_EVERY = 30.0
IFNAME_VARS = ('GLOO_SOCKET_IFNAME', 'NCCL_SOCKET_IFNAME')


def log(message: str) -> None:
    """One ``[mmddp_ext]`` line on stderr."""
    print(f'[mmddp_ext] {message}', file=sys.stderr, flush=True)


def seconds_from_env(environ: Mapping[str, str], name: str, default: float) -> float:
    """A positive number of seconds from ``environ[name]`` (``default`` when unset)."""
    raw = environ.get(name) or str(default)
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or math.isinf(value):
        raise ValueError(f'{name}={raw!r} must be a positive number of seconds, e.g. {default:g}')
    return value


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback (``localhost``, ``127.x.y.z``, ``::1``)."""
    if host == 'localhost':
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def loopback_ifname() -> Optional[str]:
    """The name of the interface that holds 127.0.0.1 ("lo" on Linux), or None."""
    try:
        interfaces = psutil.net_if_addrs()
    except Exception:  # the host hides its interfaces
        return None
    ranked = sorted((addr.address != '127.0.0.1', name) for name, addrs in interfaces.items()
                    for addr in addrs
                    if addr.family == socket.AF_INET and addr.address.startswith('127.'))
    return ranked[0][1] if ranked else None


def pin_loopback_interfaces(environ: MutableMapping[str, str]) -> Optional[str]:
    """Set GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME to the loopback interface where unset.

    For jobs whose processes all run on this host. Returns the line to log once, or None when
    nothing was set (the user chose, or no loopback interface was found).
    """
    name = loopback_ifname()
    unset = [var for var in IFNAME_VARS if not environ.get(var)]
    if name is None or not unset:
        return None
    environ.update({var: name for var in unset})
    return (f'single-host job: {" ".join(f"{v}={name}" for v in unset)} (gloo/NCCL sockets on '
            'loopback only; set these variables to choose another interface)')


def find_free_port(host: str = '127.0.0.1') -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def listen_on(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: the OS picks); OSError when taken."""
    sock = socket.socket(socket.AF_INET6 if ':' in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is not "in use"
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def port_free(port: int) -> bool:
    """Whether ``port`` can be bound on every interface, IPv4 and IPv6 (as a store would)."""
    for family, addr in ((socket.AF_INET, '0.0.0.0'), (socket.AF_INET6, '::')):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 on this host
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((addr, port))
        except OSError:
            return False
        finally:
            sock.close()
    return True


def port_holder(port: int) -> Optional[str]:
    """``"127.0.0.1:29555 by pid 1234 (python: python -m http.server 29555)"``: who listens on
    ``port`` on this host, as far as this user can see; None when nobody visible does."""
    try:
        conns = [
            c for c in psutil.net_connections('inet')
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
        ]
    except Exception:  # psutil missing, or not allowed to list connections
        return None
    if not conns:
        return None
    conn = next((c for c in conns if c.pid), conns[0])
    where = f'{conn.laddr.ip}:{port}'
    if not conn.pid:
        return f'{where} (the process holding it is not visible to this user)'
    try:
        proc = psutil.Process(conn.pid)
        command = ' '.join(' '.join(proc.cmdline()).split()) or proc.name()  # one line
        who = f'{proc.name()}: {command[:160]}{"…" if len(command) > 160 else ""}'
    except Exception:
        who = 'details not visible to this user'
    return f'{where} by pid {conn.pid} ({who})'


def port_in_use_message(variable: str, port: int, fix: str) -> str:
    """One line: ``variable=port`` is taken on this host, by whom, and ``fix``, e.g. a free
    port. The one wording for dist_train.sh's front and for ranks started by hand."""
    holder = port_holder(port)
    held = f' at {holder}' if holder else ' (the process holding it is not visible here)'
    return (f'{variable}={port} is already in use on this host ({socket.gethostname()}){held}: '
            f'{fix}, e.g. {variable}={find_free_port()}')


def unreachable_causes(master: str = 'node 0', port_variable: str = 'PORT') -> str:
    """The usual reasons a rank or node cannot reach ``master``'s store, as one clause."""
    return (f'usual causes: a wrong MASTER_ADDR (it must be the address of {master} as seen '
            f'from here), {master} not started yet, a different {port_variable} than {master}\'s, '
            'or a firewall blocking the port')


def wait_until(ready: Callable[[], Optional[T]], timeout: float, log_every: float,
               waiting: Callable[[float], str], interval: float = 0.5) -> Optional[T]:
    """Call ``ready()`` until it returns something other than None, at most ``timeout`` seconds
    (``math.inf``: no bound), logging ``waiting(elapsed seconds)`` every ``log_every`` seconds
    meanwhile. Returns what ``ready`` returned, or None at the timeout."""
    start = time.monotonic()
    next_log = start + log_every
    while True:
        outcome = ready()
        if outcome is not None:
            return outcome
        now = time.monotonic()
        if now - start >= timeout:
            return None
        if now >= next_log:
            log(waiting(now - start))
            next_log += log_every
        time.sleep(min(interval, max(0.0, start + timeout - now)))


def wait_for_listener(host: str, port: int, timeout: float, log_every: float,
                      waiting: Callable[[float], str]) -> Optional[str]:
    """Connect to ``host:port`` until something listens there, at most ``timeout`` seconds,
    logging ``waiting(elapsed seconds)`` every ``log_every`` seconds (:func:`wait_until`).

    Returns:
        None once a connection succeeded, else why not (e.g. "connection refused").
    """
    last_error = ['no answer']

    def connect() -> Optional[str]:
        try:
            with socket.create_connection((host, port), timeout=min(5.0, timeout)):
                return ''
        except socket.gaierror as e:
            return f'{host!r} does not resolve ({e.strerror})'
        except OSError as e:
            last_error[0] = (e.strerror or type(e).__name__).lower()
            return None

    outcome = wait_until(connect, timeout, log_every, waiting)
    return last_error[0] if outcome is None else (outcome or None)


def loopback_store(host: str, port: int, timeout: float):
    """A multi-tenant TCPStore server listening on ``host`` (a loopback address) only.

    torchrun's static rendezvous (and ``elastic_launch``) in this process then reuses it for
    the same port instead of listening on every interface. Port 0: the OS picks one.

    Returns:
        (store, port). Raises OSError when the port is taken.
    """
    sock = listen_on(host, port)  # first: a port in use is reported before torch loads
    port = sock.getsockname()[1]
    import torch.distributed as dist  # here: the front checks ports before torch loads

    # the store owns (and closes) the listening socket from here on
    store = dist.TCPStore(host, port, 1, True, timedelta(seconds=timeout), wait_for_workers=False,
                          multi_tenant=True, master_listen_fd=sock.detach())
    return store, port
