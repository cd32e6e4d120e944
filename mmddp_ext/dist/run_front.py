"""The front of ``tools/dist_train.sh``: check the rendezvous, then run torchrun in this process.

Usage (``dist_train.sh`` builds it; the leading options are the front's, the rest torchrun's)::

    python mmddp_ext/dist/run_front.py --nnodes=N --node-rank=R --master-addr=HOST \
        [--master-port=PORT] --nproc_per_node=G [torchrun args] SCRIPT [args]

What it adds to torchrun, before and after:

* one node: the rendezvous store listens on ``127.0.0.1`` only (``PORT``, or a port the OS
  picks), bound here and reused by torchrun's static rendezvous (a multi-tenant TCPStore), and
  ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` name the loopback interface unless set, so
  gloo and NCCL listen there too (by default gloo listens on the address the host name
  resolves to: ``127.0.1.1`` on Debian, the container's address in a container);
* a port in use is named with the process holding it, before torchrun starts (node 0);
* node R > 0 probes ``MASTER_ADDR:PORT`` first and says what it waits for every
  ``MMDDP_RENDEZVOUS_LOG_EVERY`` seconds (30); after ``MMDDP_RENDEZVOUS_TIMEOUT`` seconds
  (300) it stops with one line naming the address and the usual causes. torchrun gets the
  same bound (``--rdzv-conf timeout=…``, 900 s by default for the static rendezvous);
* a failed worker ends with one line (rank, pid, exit code or signal) instead of torchrun's
  dump of every traceback (the workers printed theirs above), and a JSON list of the failures
  (rank, local_rank, pid, exitcode, signal, host, time, error_file) is written to
  ``$MMDDP_LAUNCH_REPORT`` when set.

Exit codes: 0 done; 1 a worker failed; 2 nothing was started (bad setting, port in use, master
unreachable, the other nodes did not join); 75 every worker stopped on a signal after saving.

Run as a script (``dist_train.sh`` does), so that the agent does not import the ``mmddp_ext``
package (and with it MMEngine): this file needs only the standard library, torch and psutil.
``mmddp_ext.dist.launch`` uses the same helpers for ranks started by hand or by Slurm.
"""
import errno
import ipaddress
import json
import math
import os
import socket
import sys
import threading
import time
from typing import Callable, List, Mapping, MutableMapping, Optional, Sequence, Tuple

TIMEOUT_ENV = 'MMDDP_RENDEZVOUS_TIMEOUT'
LOG_EVERY_ENV = 'MMDDP_RENDEZVOUS_LOG_EVERY'
REPORT_ENV = 'MMDDP_LAUNCH_REPORT'
DEFAULT_TIMEOUT = 300.0
DEFAULT_LOG_EVERY = 30.0
IFNAME_VARS = ('GLOO_SOCKET_IFNAME', 'NCCL_SOCKET_IFNAME')
NOTHING_STARTED = 2
STOPPED = 75  # every worker stopped on a signal after its checkpoint (PreemptionHook)


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
        import psutil
        interfaces = psutil.net_if_addrs()
    except Exception:  # psutil missing or the host hides its interfaces
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
        import psutil
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


def wait_for_listener(host: str, port: int, timeout: float, log_every: float,
                      waiting: Callable[[float], str]) -> Optional[str]:
    """Connect to ``host:port`` until something listens there, at most ``timeout`` seconds.

    Logs ``waiting(elapsed seconds)`` every ``log_every`` seconds while it waits.

    Returns:
        None once a connection succeeded, else the last error (e.g. "connection refused").
    """
    start = time.monotonic()
    next_log, error = start + log_every, 'no answer'
    while True:
        now = time.monotonic()
        if now - start >= timeout:
            return error
        if now >= next_log:
            log(waiting(now - start))
            next_log += log_every
        try:
            with socket.create_connection((host, port), timeout=min(5.0, timeout)):
                return None
        except socket.gaierror as e:
            return f'{host!r} does not resolve ({e.strerror})'
        except OSError as e:
            error = (e.strerror or type(e).__name__).lower()
        time.sleep(min(0.5, max(0.0, start + timeout - time.monotonic())))


def loopback_store(host: str, port: int, timeout: float):
    """A multi-tenant TCPStore server listening on ``host`` (a loopback address) only.

    torchrun's static rendezvous (and ``elastic_launch``) in this process then reuses it for
    the same port instead of listening on every interface. Port 0: the OS picks one.

    Returns:
        (store, port). Raises OSError when the port is taken.
    """
    sock = listen_on(host, port)  # first: a port in use is reported before torch loads
    port = sock.getsockname()[1]
    from datetime import timedelta

    import torch.distributed as dist

    # the store owns (and closes) the listening socket from here on
    store = dist.TCPStore(host, port, 1, True, timedelta(seconds=timeout), wait_for_workers=False,
                          multi_tenant=True, master_listen_fd=sock.detach())
    return store, port


def _by_path(name: str, relative: str):
    """A stdlib-only sibling module of the package, loaded from its file (no package import)."""
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), relative)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def failure_records(failures: dict) -> List[dict]:
    """torchrun's ``ChildFailedError.failures`` ({rank: ProcessFailure}) as plain records, the
    first failure first; ``signal`` is the signal's name (``"SIGKILL"``) or None.

    The agent inserts failures in the order it saw them (the ranks it stopped itself come
    last), and whole seconds often tie, so the sort by time keeps that order for ties.
    """
    import signal
    host = socket.gethostname()
    records = []
    for rank, f in sorted(failures.items(), key=lambda item: item[1].timestamp):
        try:
            name = signal.Signals(-f.exitcode).name if f.exitcode < 0 else None
        except ValueError:
            name = None
        records.append(
            dict(rank=rank, local_rank=f.local_rank, pid=f.pid, exitcode=f.exitcode, signal=name,
                 host=host, time=f.timestamp,
                 error_file=None if f.error_file == '<N/A>' else f.error_file))
    return records


def failure_line(records: Sequence[dict], more: str) -> str:
    """``torchrun: rank 1 (pid 1234) exited with signal SIGKILL; <more>`` for the first one."""
    first = records[0]
    how = f'signal {first["signal"]}' if first['signal'] else f'exit code {first["exitcode"]}'
    others = f' (first of {len(records)} failed ranks)' if len(records) > 1 else ''
    return f'torchrun: rank {first["rank"]} (pid {first["pid"]}) exited with {how}{others}; {more}'


def write_report(path: str, records: Sequence[dict]) -> None:
    """The failure records as a JSON list at ``path``, written atomically."""
    io = _by_path('_mmddp_ext_io', os.path.join('..', 'utils', 'io.py'))
    io.atomic_write_text(path, json.dumps(list(records), indent=1) + '\n')


class _WaitLog(threading.Thread):
    """Logs ``line(elapsed)`` every ``every`` seconds until stopped or ``done()``."""

    def __init__(self, line: Callable[[float], str], every: float, done: Callable[[], bool]):
        super().__init__(daemon=True)
        self.line, self.every, self.done = line, every, done
        self.stopped = threading.Event()

    def run(self) -> None:
        start = time.monotonic()
        while not self.stopped.wait(self.every) and not self.done():
            log(self.line(time.monotonic() - start))


def _workers_started() -> bool:
    """The rendezvous is over once the agent (this process) has started its workers."""
    try:
        import psutil
        return bool(psutil.Process().children())
    except Exception:
        return True  # cannot tell: stay quiet


_OPTIONS = {
    '--nnodes': 'nnodes',
    '--node-rank': 'node_rank',
    '--master-addr': 'master_addr',
    '--master-port': 'master_port'
}


def split_args(argv: Sequence[str]) -> Tuple[dict, List[str]]:
    """The front's leading ``--name=value`` options, and the rest (torchrun's)."""
    opts = dict(nnodes='1', node_rank='0', master_addr='127.0.0.1', master_port=None)
    rest = list(argv)
    while rest and rest[0].split('=', 1)[0] in _OPTIONS and '=' in rest[0]:
        name, value = rest.pop(0).split('=', 1)
        opts[_OPTIONS[name]] = value
    for key in ('nnodes', 'node_rank', 'master_port'):
        if opts[key] is not None and not opts[key].isdigit():
            raise ValueError(f'--{key.replace("_", "-")}={opts[key]!r} must be a whole number')
    return opts, rest


def _prepare(opts: dict, timeout: float, log_every: float):
    """Checks before torchrun; returns (master address, port, loopback store or None)."""
    nnodes, node_rank = int(opts['nnodes']), int(opts['node_rank'])
    addr, port = opts['master_addr'], opts['master_port']
    if nnodes == 1:
        try:
            store, port = loopback_store('127.0.0.1', int(port or 0), timeout)
        except OSError as e:
            raise ValueError(
                port_in_use_message(
                    'PORT', int(port), 'leave PORT unset on a single node (a free port is picked) '
                    'or choose another') if e.errno ==
                errno.EADDRINUSE else f'cannot listen on 127.0.0.1:{port}: {e.strerror}') from None
        note = pin_loopback_interfaces(os.environ)
        if note:
            log(note)
        return '127.0.0.1', port, store
    port = int(port or 29500)
    if node_rank == 0 and not port_free(port):
        raise ValueError(
            port_in_use_message('PORT', port,
                                'stop that process or choose another PORT on every node'))
    if node_rank > 0:
        error = wait_for_listener(
            addr, port, timeout, log_every, lambda s:
            (f'node {node_rank} waiting for node 0 at {addr}:{port} ({s:.0f} s)'))
        if error is not None:
            raise ValueError(
                f'node {node_rank} could not reach node 0 at MASTER_ADDR={addr} PORT={port} '
                f'within {timeout:.0f} s ({error}; {TIMEOUT_ENV} sets the wait): '
                f'{unreachable_causes()}')
    return addr, port, None


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Check, then run torchrun here; returns the exit code (see the module docstring)."""
    try:
        opts, rest = split_args(sys.argv[1:] if argv is None else argv)
        timeout = seconds_from_env(os.environ, TIMEOUT_ENV, DEFAULT_TIMEOUT)
        log_every = seconds_from_env(os.environ, LOG_EVERY_ENV, DEFAULT_LOG_EVERY)
        addr, port, store = _prepare(opts, timeout, log_every)
    except ValueError as e:
        log(f'error: {e}')
        return NOTHING_STARTED
    import torch.distributed as dist
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run  # not main: its @record adds a log line
    nnodes, node_rank = int(opts['nnodes']), int(opts['node_rank'])
    waiter = None
    if nnodes > 1:
        whom = f'the other nodes (NNODES={nnodes})' if node_rank == 0 else 'the rendezvous'
        waiter = _WaitLog(
            lambda s: f'node {node_rank} waiting for {whom} at {addr}:{port} '
            f'({s:.0f} s)', log_every, _workers_started)
        waiter.start()
    args = [
        f'--nnodes={nnodes}', f'--node-rank={node_rank}', '--rdzv-backend=static',
        f'--master-addr={addr}', f'--master-port={port}',
        f'--rdzv-conf=timeout={math.ceil(timeout)}', *rest
    ]
    try:
        run(parse_args(args))
    except ChildFailedError as e:
        records = failure_records(e.failures)
        # PreemptionHook: the first exit is a stop after the save that every worker took part
        # in; the others may then be ended by the agent: saved, not failed
        if records and records[0]['exitcode'] == STOPPED:
            log(f'torchrun: the workers stopped on a signal after saving a checkpoint (exit code '
                f'{STOPPED}): --resume continues')
            return STOPPED
        report = os.environ.get(REPORT_ENV)
        if report:
            write_report(report, records)
        log(failure_line(records, 'diagnosis below' if report else 'worker errors above'))
        return 1
    except dist.DistError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        fix = (f'start dist_train.sh on every node with NNODES={nnodes}, its own NODE_RANK, '
               f'MASTER_ADDR=<address of this host> and PORT={port}, and check that no firewall '
               'blocks the port') if node_rank == 0 else unreachable_causes()
        log(f'error: node {node_rank} did not complete the rendezvous at {addr}:{port} within '
            f'{timeout:.0f} s ({TIMEOUT_ENV} sets the wait): {fix} (torchrun: {first})')
        return NOTHING_STARTED
    finally:
        if waiter is not None:
            waiter.stopped.set()
        del store
    return 0


if __name__ == '__main__':
    sys.exit(main())
