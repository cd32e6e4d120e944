"""A rank's stderr kept in a file (:mod:`mmddp_ext.diagnose.stderr_copy`), also what native code
writes to fd 2 right before the process aborts (as gloo does on a collective mismatch)."""
import os
import signal
import subprocess
import sys

from mmddp_ext.diagnose.stderr_copy import KEEP_ENV, stderr_tail

ABORTS = '''
import os, sys
from mmddp_ext.diagnose.stderr_copy import keep_stderr
assert keep_stderr(sys.argv[1]) is not None
print('python line', file=sys.stderr, flush=True)
os.write(2, b"terminate called after throwing an instance of 'gloo::EnforceNotMet'\\n")
os.abort()
'''


def _run(tmp_path, env=None):
    path = str(tmp_path / 'ranks' / 'rank1.stderr.txt')
    proc = subprocess.run([sys.executable, '-c', ABORTS, path], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, **(env or {})))
    return proc, path


def test_what_an_aborting_process_wrote_reaches_the_console_and_the_file(tmp_path):
    proc, path = _run(tmp_path)
    assert proc.returncode == -signal.SIGABRT
    for text in (proc.stderr, stderr_tail(path)):  # tee outlives the abort: both have it
        assert 'python line' in text and 'gloo::EnforceNotMet' in text


def test_the_tail_is_the_end_of_the_file(tmp_path):
    path = tmp_path / 'x.txt'
    path.write_text('a' * 100 + 'END')
    assert stderr_tail(str(path), 5) == 'aaEND'
    assert stderr_tail(str(tmp_path / 'missing.txt')) == ''


def test_it_can_be_switched_off(tmp_path):
    proc, path = _run(tmp_path, {KEEP_ENV: '0'})
    assert proc.returncode == 1 and 'AssertionError' in proc.stderr  # it said: not started
    assert not os.path.exists(path)
