"""Ranks that die without a Python exception: what killed them, and what is likely.

The launcher knows the signal (torchrun's ``ProcessFailure``: exit code -9 is SIGKILL); the
rank's progress file (:mod:`mmddp_ext.diagnose.records`) knows the last iteration it completed
and its memory then; the kernel log, when it can be read, knows whether the OOM killer chose it.
"""
import re
import signal
import subprocess
from typing import Dict, List, Optional

from ..node.limits import SHM_FIX
from ..utils.process import host_memory_bytes
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


def death_lines(failure: Dict, state: Optional[Dict], kernel: Optional[List[str]],
                host_total: Optional[int], native_crash: bool = True) -> List[str]:
    """The diagnosis of one rank killed by a signal (pure formatting).

    Args:
        failure: the launcher's entry (rank, pid, exitcode, signal, host).
        state: the rank's progress file, or None.
        kernel: :func:`kernel_log` lines for its pid, or None when unreadable.
        host_total: the host's memory, bytes.
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
        total = '' if host_total is None else f' of {format_mib(host_total)} host memory'
        lines.append(f'  last memory sample: host RSS {format_mib(state["rss"])}{total}' +
                     ('' if state.get('device_allocated') is
                      None else f', device allocated {format_mib(state["device_allocated"])}'))
    if sig == 'SIGKILL':
        if kernel:
            lines.append(f'  kernel log: {kernel[-1][:200]}')
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
    is never this: our workers leave a stop signal to their rank (:mod:`mmddp_ext.ddp.workers`)
    and die with it (``PR_SET_PDEATHSIG``)."""
    found = _WORKER_DEATH.search(message)
    if not found:
        return []
    how, fix = _WORKER_CAUSES.get((found.group(2) or '').strip(), _WORKER_OTHER)
    return [
        f'  cause: its DataLoader worker (pid {found.group(1).strip()}) died of {how}',
        f'  fix: {fix}'
    ]


# a worker that could not hand its batch over (mmddp_ext.ddp.shared_batches), or torch's own
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
