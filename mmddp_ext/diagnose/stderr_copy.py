"""A copy of this rank's stderr in ``<work_dir>/ranks/rank{R}.stderr.txt``, for the diagnosis.

A rank that dies in native code leaves no Python exception: gloo, for one, aborts the process
with ``terminate called after throwing an instance of 'gloo::EnforceNotMet' … Received data
size doesn't match expected size``, written by C++ straight to file descriptor 2. Only the
console saw it, and the diagnosis runs after the console scrolled. So the entry sends fd 2
through ``tee``, a child process in its own session (a signal to the job's process group does
not stop it, and it outlives an abort of the rank): everything still reaches the console, and
the file keeps it. :func:`stderr_tail` reads the end back. ``MMDDP_KEEP_STDERR=0`` turns it off.
"""
import os
import shutil
import subprocess
import sys
from typing import Optional

KEEP_ENV = 'MMDDP_KEEP_STDERR'
TAIL_BYTES = 16384


def keep_stderr(path: str) -> Optional[subprocess.Popen]:
    """From now on, copy fd 2 of this process (and of the processes it starts) to ``path``
    (truncated first). Returns the ``tee`` process, or None when it was not started
    (switched off, no ``tee``, or an error: the run goes on with a plain stderr)."""
    if os.environ.get(KEEP_ENV, '1') == '0' or shutil.which('tee') is None:
        return None
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        open(path, 'w').close()
        sys.stderr.flush()
        read_end, write_end = os.pipe()
        proc = subprocess.Popen(['tee', '-a', path], stdin=read_end, stdout=2,
                                start_new_session=True)
        os.close(read_end)
        os.dup2(write_end, 2)
        os.close(write_end)
        return proc
    except OSError:
        return None


def stderr_tail(path: str, size: int = TAIL_BYTES) -> str:
    """The last ``size`` bytes of the kept stderr, as text ('' when there is none)."""
    try:
        with open(path, 'rb') as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return f.read().decode('utf-8', 'replace')
    except OSError:
        return ''
