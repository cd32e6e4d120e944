"""A node whose /dev/shm is 1 MiB (a tmpfs over it, in a mount namespace of its own), the demo
on 2 processes under ``bash tools/dist_train.sh`` with its own 2 DataLoader workers: the node
is named before the first iteration, with /dev/shm's size and the fixes; then a worker that
cannot hand its batch over raises in its rank, the run stops (it stalled until killed before)
and the diagnosis names /dev/shm, its size and the fixes. Skipped where mount namespaces cannot
be made."""
import os
import signal
import subprocess

import pytest

from conftest import DEMO_CONFIG, DEMO_WORKERS, ROOT, demo_options

WARNING = 'shared memory needs'


def _private_shm_possible() -> bool:
    probe = subprocess.run([
        'unshare', '-m', '--propagation', 'private', 'sh', '-c',
        'mount -t tmpfs -o size=1m none /dev/shm'
    ], capture_output=True)
    return probe.returncode == 0


@pytest.mark.slow
def test_a_small_dev_shm_is_named_before_the_first_iteration_and_when_it_stops_the_run(
        demo_data, tmp_path):
    if not _private_shm_possible():
        pytest.skip('no mount namespace with its own /dev/shm here (unshare -m as root)')
    opts = demo_options(demo_data, 1, **DEMO_WORKERS)
    script = ('mount -t tmpfs -o size=1m none /dev/shm && exec bash tools/dist_train.sh "$@"')
    env = dict(os.environ, PYTHONUNBUFFERED='1', OMP_NUM_THREADS='1',
               PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
    proc = subprocess.Popen([
        'unshare', '-m', '--propagation', 'private', 'bash', '-c', script, 'node', DEMO_CONFIG, '2',
        '--work-dir',
        str(tmp_path / 'w'), *opts
    ], cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:  # the bound: a stalled run is killed here, and fails below
        out, _ = proc.communicate(timeout=300)  # the watchdog: 600 s
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out = proc.communicate()[0] + '\n(killed: still running after 300 s)'
    seen = out.splitlines()
    assert WARNING in out, out[-5000:]
    warning = next(line for line in seen if WARNING in line)
    assert 'of its 1.00 MiB (2 rank(s) × 2 worker(s) × prefetch_factor 2' in warning
    assert '--shm-size' in warning and 'prefetch_factor' in warning
    assert 'Epoch(train)' not in out[:out.index(warning)]  # before the first iteration
    assert proc.returncode not in (0, None), out[-5000:]
    screen = out[out.index('==== mmddp_ext diagnosis'):]
    assert 'could not hand its batch to its rank through shared memory: /dev/shm on host' in screen
    assert 'has 1.00 MiB' in screen, screen
    assert 'cause: /dev/shm is too small' in screen and '--shm-size' in screen, screen
