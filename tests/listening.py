"""Which sockets a running job listens on, and a host name that resolves beyond loopback.

``other_hostname_prefix`` gives a command prefix under which this machine's host name resolves
to one of its non-loopback addresses, as in a container (where gloo would listen by default).
``finish_watching_sockets`` waits for started commands and reads their listening sockets at
every line they print (the job prints a line per iteration, so the sockets are read while the
job is surely up, not on a timer that may miss it).
"""
import shutil
import socket
import subprocess
import sys
import threading
from typing import List, Optional, Set, Tuple

import psutil

PYTHON = sys.executable


def _non_loopback_address() -> Optional[str]:
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith(('127.', '169.254.')):
                return a.address
    return None


def other_hostname_prefix(folder: str) -> Tuple[Optional[List[str]], str]:
    """``(prefix, '')``, or ``(None, why not)`` where this machine cannot give a process tree
    such a host name.

    New user, mount and UTS namespaces (``unshare -Urmu``, no privileges needed where user
    namespaces are allowed): a private /etc/hosts bind-mounted over the real one, a new host
    name. glibc's HOSTALIASES does not help: /etc/hosts is read before it is consulted.
    """
    address = _non_loopback_address()
    if address is None:
        return None, 'this machine has no non-loopback IPv4 address to resolve a host name to'
    if shutil.which('unshare') is None:
        return None, 'unshare (util-linux) is not installed'
    hosts = f'{folder}/hosts'
    name = 'mmddp-test-host'
    with open(hosts, 'w') as f:
        f.write(f'127.0.0.1 localhost\n{address} {name}\n')
    prefix = [
        'unshare', '-Urmu', 'sh', '-c',
        'mount --bind "$0" /etc/hosts && hostname "$1" && shift && exec "$@"', hosts, name
    ]
    probe = subprocess.run(
        prefix + [PYTHON, '-c', 'import socket; print(socket.gethostbyname(socket.gethostname()))'],
        capture_output=True, text=True, timeout=60)
    if probe.returncode != 0 or probe.stdout.strip() != address:
        return None, ('cannot give this process tree a host name that resolves to a non-loopback '
                      f'address (unshare -Urmu: {(probe.stderr or probe.stdout).strip()[:200]})')
    return prefix, ''


def listening(root_pid: int) -> Set[Tuple[int, str]]:
    """``{(pid, ip)}`` of every listening socket in the process tree of ``root_pid`` now."""
    try:
        tree = [psutil.Process(root_pid)] + psutil.Process(root_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return set()
    seen = set()
    for q in tree:
        try:
            seen |= {(q.pid, c.laddr.ip)
                     for c in q.net_connections('inet') if c.status == psutil.CONN_LISTEN}
        except psutil.Error:
            pass
    return seen


def finish_watching_sockets(procs: List[subprocess.Popen],
                            timeout: float = 600) -> Tuple[List[Tuple[int, str]], Set]:
    """Wait for every started process (text stdout, stderr merged), reading each one's
    listening sockets at every line it prints; ``([(returncode, output), ...], {(pid, ip)})``."""
    seen, outs = set(), [[] for _ in procs]

    def watch(i: int, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            outs[i].append(line)
            seen.update(listening(proc.pid))

    threads = [
        threading.Thread(target=watch, args=(i, p), daemon=True) for i, p in enumerate(procs)
    ]
    for t in threads:
        t.start()
    for p, t in zip(procs, threads):
        p.wait(timeout=timeout)
        t.join(timeout=60)
    return [(p.returncode, ''.join(o)) for p, o in zip(procs, outs)], seen


def assert_loopback_only(seen: Set[Tuple[int, str]], outs: List[Tuple[int, str]]) -> None:
    """Every command ended with 0, more than one process listened (the store's and the
    workers': gloo listens in each), and only on 127.0.0.1."""
    for rc, out in outs:
        assert rc == 0, out[-4000:]
    assert len({pid for pid, _ in seen}) >= 2, f'too few processes seen listening: {seen}'
    assert {ip for _, ip in seen} <= {'127.0.0.1'}, f'listening beyond loopback: {seen}'
