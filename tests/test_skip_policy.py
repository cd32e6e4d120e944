"""``MMDDP_ONLY_GPU_SKIPS=1`` (set by ``.ci/run``): a run in which a test skipped for anything but
a missing GPU fails, naming the test and its reason; GPU skips alone leave it green."""
import os
import subprocess
import sys

from conftest import ROOT

TESTS = '''
import pytest

def test_runs():
    pass

def test_gpu():
    pytest.skip('needs a CUDA GPU')
'''


def _pytest(tmp_path, extra: str, strict: bool) -> subprocess.CompletedProcess:
    (tmp_path / 'test_some.py').write_text(TESTS + extra)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, 'tests'), ROOT]))
    env.pop('PYTEST_XDIST_WORKER', None)
    env['MMDDP_ONLY_GPU_SKIPS'] = '1' if strict else '0'
    return subprocess.run([
        sys.executable, '-m', 'pytest', '-p', 'conftest', '-p', 'no:cacheprovider', '-q',
        str(tmp_path / 'test_some.py')
    ], cwd=str(tmp_path), env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=300)


def test_a_skip_that_is_not_a_gpu_fails_the_run(tmp_path):
    extra = '\ndef test_slurm():\n    pytest.skip("no local Slurm cluster: slurmctld failed")\n'
    strict = _pytest(tmp_path, extra, strict=True)
    assert strict.returncode == 1, strict.stdout
    assert 'test_some.py::test_slurm: no local Slurm cluster' in strict.stdout, strict.stdout
    assert 'test_gpu' not in strict.stdout.split('skips that are not a missing GPU')[1]
    lenient = _pytest(tmp_path, extra, strict=False)
    assert lenient.returncode == 0, lenient.stdout


def test_gpu_skips_alone_leave_the_run_green(tmp_path):
    got = _pytest(tmp_path, '', strict=True)
    assert got.returncode == 0 and '1 passed, 1 skipped' in got.stdout, got.stdout
