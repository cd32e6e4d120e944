"""The package's one atomic write (:mod:`mmddp_launch.files`) in real child processes: killed in
the middle of writing, and on a full filesystem, the file at the path is the old one, whole.

The module imports the standard library only, so each child starts in a moment."""
import errno
import os
import os.path as osp
import signal
import subprocess
import sys
import textwrap

import pytest

IO = 'mmddp_launch.files'
OLD = b'old checkpoint\n' * 100
NEW_SIZE = 2 << 20  # larger than both limits below

# argv: the module, the path to write, the file-size limit in bytes (0: none)
_WRITER = textwrap.dedent('''
    import importlib, resource, signal, sys
    io = importlib.import_module(sys.argv[1])
    limit = int(sys.argv[3])
    if limit:  # the kernel stops the write at the limit and kills this process (SIGXFSZ,
        # which Python ignores unless told otherwise)
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    try:
        io.atomic_write_bytes(sys.argv[2], b'n' * %d)
    except OSError as e:
        print('ERRNO', e.errno)
''' % NEW_SIZE)


def _parts(folder: str) -> list:
    return sorted(n for n in os.listdir(folder) if n.endswith('.part'))


@pytest.mark.parametrize('existed', [True, False])
def test_a_process_killed_mid_write_leaves_the_old_file_whole(tmp_path, existed):
    path = tmp_path / 'epoch_1.pth'
    if existed:
        path.write_bytes(OLD)
    limit = 64 << 10
    proc = subprocess.run([sys.executable, '-c', _WRITER, IO,
                           str(path), str(limit)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGXFSZ, proc.stdout + proc.stderr
    [part] = _parts(str(tmp_path))  # the crash came mid-write: the temporary file is partial
    assert osp.getsize(tmp_path / part) == limit
    if existed:
        assert path.read_bytes() == OLD
    else:
        assert not path.exists()  # never half a file under the name


def test_a_full_filesystem_raises_and_leaves_the_old_file_whole(tmp_path):
    probe = subprocess.run(['unshare', '-m', '--propagation', 'private', 'true'],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip('no mount namespace here (unshare -m as root)')
    folder = tmp_path / 'small'
    folder.mkdir()
    path = folder / 'epoch_1.pth'
    # a 1 MiB tmpfs over the folder, in a mount namespace of its own; the old file is written
    # there first, so the check after the failed write reads it from the same filesystem
    script = ('mount -t tmpfs -o size=1m none "$1" && printf "%s" "$2" > "$1/epoch_1.pth" && '
              '"$3" -c "$4" "$5" "$1/epoch_1.pth" 0; cmp -s "$1/epoch_1.pth" "$6" && echo SAME; '
              'ls -a "$1"')
    old = tmp_path / 'old'
    old.write_bytes(OLD)
    proc = subprocess.run([
        'unshare', '-m', '--propagation', 'private', 'sh', '-c', script, 'sh',
        str(folder),
        OLD.decode(), sys.executable, _WRITER, IO,
        str(old)
    ], capture_output=True, text=True, timeout=120)
    out = proc.stdout
    assert f'ERRNO {errno.ENOSPC}' in out, out + proc.stderr
    assert 'SAME' in out, out + proc.stderr  # the old file, whole
    assert '.part' not in out, out  # the temporary file was removed
    assert not path.exists()  # the tmpfs was this process's only
