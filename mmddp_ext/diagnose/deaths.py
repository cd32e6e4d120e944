"""Ranks that die without a Python exception: what killed them, and what is likely.

The launcher knows the signal (torchrun's ``ProcessFailure``: exit code -9 is SIGKILL); the
rank's progress file (:mod:`mmddp_ext.diagnose.records`) knows the last iteration it completed
and its memory then; the kernel log, and the rank's memory cgroup (its count of OOM kills, then
and now), when they can be read, know whether the OOM killer chose it.
"""
import re
import signal
import socket
import subprocess
from typing import Callable, Dict, List, Optional

from ..node.facts import memory_limit, oom_kills
from ..node.limits import SHM_FIX
from ..utils.memory_reads import host_memory_bytes
from ..utils.units import format_mib

LAUNCHER_STOP = ('SIGTERM', 'SIGINT', 'SIGHUP')  # how a launcher or a person stops a job


def signal_name(failure: Dict) -> Optional[str]:
    """The signal that ended the process of a launcher failure entry, or None."""
    name = failure.get('signal')
    if name:
        return str(name)
    code = failure.get('exitcode')
    if isinstance(code, int) and code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f'signal {-code}'
    return None


def kernel_log(pid: int, run=subprocess.run) -> Optional[List[str]]:
    """Kernel log lines about ``pid`` being killed (OOM killer), or None when unreadable."""
    try:
        out = run(['dmesg'], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    keys = (f'Killed process {pid} ', f'Killed process {pid},', f'pid={pid},')
    return [ln.strip() for ln in out.stdout.splitlines() if any(k in ln for k in keys)]


def host_memory_total() -> Optional[int]:
    """This host's memory, bytes (psutil), or None."""
    try:
        return host_memory_bytes()
    except Exception:
        return None


def cgroup_count(state: Optional[Dict], host: Optional[str] = None,
                 read: Callable[[Optional[str]], Optional[int]] = oom_kills) -> Dict:
    """What the OOM killer of a rank's memory cgroup did during its run: the folder and
    ``oom_kill`` when the rank started (its progress file) and now, with ``killed`` (how many
    it ended since); or the folder and ``why`` the count is unknown. Read only on the rank's
    own host (default: this one)."""
    state, host = state or {}, host or socket.gethostname()
    folder, before = state.get('memory_cgroup'), state.get('oom_kills_at_start')
    if state.get('host') not in (None, host):
        return dict(folder=folder, why=f'it is read on host {state.get("host")} only')
    now = read(folder)
    if folder is None or before is None or now is None:
        return dict(
            folder=folder, why='no memory cgroup, or its memory.events / '
            'memory.oom_control has no oom_kill count'
            if folder else 'the rank recorded no memory cgroup')
    return dict(folder=folder, before=before, now=now, killed=max(0, now - before),
                limit=memory_limit(folder))


def cgroup_lines(cgroup: Optional[Dict]) -> List[str]:
    """One line on the memory cgroup's OOM kills (:func:`cgroup_count`), none without one."""
    if not cgroup:
        return []
    if 'why' in cgroup:
        return [f"  memory cgroup: its OOM kill count could not be read ({cgroup['why']})"]
    if cgroup['killed']:
        limit = '' if cgroup.get('limit') is None else f' (limit {format_mib(cgroup["limit"])})'
        return [
            f"  memory cgroup {cgroup['folder']}{limit}: its OOM killer ended "
            f"{cgroup['killed']} process(es) during this run (oom_kill {cgroup['before']} -> "
            f"{cgroup['now']})"
        ]
    return [
        f"  memory cgroup {cgroup['folder']}: no OOM kill during this run (oom_kill "
        f"{cgroup['now']})"
    ]


def death_lines(failure: Dict, state: Optional[Dict], kernel: Optional[List[str]],
                host_total: Optional[int], native_crash: bool = True,
                cgroup: Optional[Dict] = None) -> List[str]:
    """The diagnosis of one rank killed by a signal (pure formatting).

    Args:
        failure: the launcher's entry (rank, pid, exitcode, signal, host).
        state: the rank's progress file, or None.
        kernel: :func:`kernel_log` lines for its pid, or None when unreadable.
        host_total: the host's memory, bytes.
        cgroup: :func:`cgroup_count` of the rank's memory cgroup, or None.
        native_crash: whether an abort or a segfault is to be called a native crash (not
            when the caller knows why the process aborted).
    """
    sig = signal_name(failure) or f'exit code {failure.get("exitcode")}'
    state = state or {}
    done = state.get('completed_iter')
    after = ('before completing an iteration'
             if done is None else f'after completing iteration {done}')
    lines = [
        f'rank {failure.get("rank")} (host {failure.get("host") or state.get("host")}, '
        f'pid {failure.get("pid") or state.get("pid")}) was killed by {sig} {after}: '
        'no Python exception, so no traceback'
    ]
    if state.get('rss') is not None:
        limit = (cgroup or {}).get('limit')
        total = (f" of its memory cgroup's limit, {format_mib(limit)}" if limit else
                 '' if host_total is None else f' of {format_mib(host_total)} host memory')
        lines.append(f'  last memory sample: host RSS {format_mib(state["rss"])}{total}' +
                     ('' if state.get('device_allocated') is
                      None else f', device allocated {format_mib(state["device_allocated"])}'))
    if sig == 'SIGKILL':
        counted = cgroup_lines(cgroup)
        if kernel:
            lines.append(f'  kernel log: {kernel[-1][:200]}')
        lines += counted
        if (cgroup or {}).get('killed') or any('Memory cgroup' in ln for ln in kernel or []):
            lines.append("  cause: the out-of-memory killer of the job's memory cgroup chose "
                         "this rank: the job's memory limit (host memory, not GPU memory)")
        elif kernel:
            lines.append("  cause: the host's out-of-memory killer chose this rank")
        else:
            lines.append("  likely: the host's out-of-memory killer (host memory, not GPU "
                         'memory), or a scheduler or a person (kill -9, a job memory limit)' +
                         ('; the kernel log could not be read' if kernel is
                          None else '; the kernel log does not mention this pid'))
        lines.append('  fix: if memory: fewer DataLoader workers (train_dataloader.num_workers)'
                     ', a smaller per-device batch, or more host memory for the job')
    elif native_crash and sig in ('SIGSEGV', 'SIGBUS', 'SIGABRT', 'SIGFPE', 'SIGILL'):
        lines.append('  cause: a crash in native code (a C/C++/CUDA extension, the driver); '
                     'the Python stack at the crash is in the stack file below, if written')
    return lines


# torch's words when a DataLoader worker dies: "DataLoader worker (pid 12) is killed by signal:
# Killed." and "DataLoader worker (pid(s) 12, 13) exited unexpectedly"
_WORKER_DEATH = re.compile(r'DataLoader worker \(pid(?:\(s\))? ([\d, ]+)\) (?:is killed by signal: '
                           r'([^.]+)|exited unexpectedly)')
_WORKER_CAUSES = {
    'Killed': ("SIGKILL, alone: most often the host's out-of-memory killer (`dmesg | grep -i "
               '"out of memory"`), or a job memory limit', 'fewer DataLoader workers '
               '(train_dataloader.num_workers), a smaller per-device batch, or more host memory '
               'for the job'),
    'Bus error': ('a bus error: most often shared memory (/dev/shm) too small for the batches '
                  'the workers hand over', SHM_FIX),
}
_WORKER_OTHER = ('a crash in the worker (the dataset, its transforms or a library they call)',
                 'rerun with train_dataloader.num_workers=0: the error is then raised in the rank '
                 'itself, with its traceback')


def worker_death_lines(message: str) -> List[str]:
    """The cause and the fix where a rank raised because one of its DataLoader workers died by
    itself (torch's message), [] for any other message. A worker that the job's own stop ends
    is never this: our workers leave a stop signal to their rank
    (:mod:`mmddp_ext.dataloader.workers`) and die with it (``PR_SET_PDEATHSIG``)."""
    found = _WORKER_DEATH.search(message)
    if not found:
        return []
    how, fix = _WORKER_CAUSES.get((found.group(2) or '').strip(), _WORKER_OTHER)
    return [
        f'  cause: its DataLoader worker (pid {found.group(1).strip()}) died of {how}',
        f'  fix: {fix}'
    ]


# a worker that could not hand its batch over (mmddp_ext.dataloader.shared_batches), or torch's own
# words where a tensor could not be put into shared memory
_SHM_FULL = re.compile(r'could not hand its batch to its rank through shared memory|unable to '
                       r'allocate shared memory|unable to write to file </torch_')


def shared_memory_lines(message: str) -> List[str]:
    """The cause and the fix where a rank raised because /dev/shm could not hold a batch of its
    DataLoader workers; [] for any other message."""
    if not _SHM_FULL.search(message):
        return []
    return [
        '  cause: /dev/shm is too small for the batches in flight: each worker hands its batches '
        'to its rank through it, num_workers × prefetch_factor of them per rank (--explain '
        "shows this node's need)", f'  fix: {SHM_FIX}'
    ]
