"""diagnose/records: the progress file a rank rewrites after every iteration, read back by the
diagnosis whole at every moment, and closed with its writer."""
import gc
import json
import os
import subprocess
import sys

from mmddp_ext.diagnose.records import ProgressFile, begin_progress, progress_path, read_ranks


def _open_on(path):
    """This process's file descriptors open on ``path``."""
    folder = f'/proc/{os.getpid()}/fd'
    out = []
    for fd in os.listdir(folder):
        try:
            if os.readlink(os.path.join(folder, fd)) == os.path.realpath(path):
                out.append(fd)
        except OSError:  # closed meanwhile
            pass
    return out


def test_a_shorter_state_after_a_longer_one_reads_whole(tmp_path):
    progress = ProgressFile(begin_progress(str(tmp_path), 0))
    progress.write(dict(rank=0, phase='train', note='x' * 300))
    progress.write(dict(rank=0, phase='done'))
    with open(progress_path(str(tmp_path), 0)) as f:
        assert json.load(f) == dict(rank=0, phase='done')
    assert read_ranks(str(tmp_path))[0]['phase'] == 'done'
    progress.close()


def test_a_new_run_starts_the_file_afresh(tmp_path):
    first = ProgressFile(begin_progress(str(tmp_path), 1))
    first.write(dict(rank=1, phase='train', note='y' * 500))
    first.close()
    second = ProgressFile(begin_progress(str(tmp_path), 1))
    second.write(dict(rank=1, phase='start'))
    assert os.path.getsize(progress_path(str(tmp_path),
                                         1)) == len(json.dumps(dict(rank=1, phase='start')))
    second.close()


def test_the_file_is_closed_when_its_writer_is_dropped(tmp_path):
    progress = ProgressFile(begin_progress(str(tmp_path), 0))
    assert len(_open_on(progress.path)) == 1
    path = progress.path
    del progress  # a run that raised: no after_run closed it
    gc.collect()
    assert _open_on(path) == []


def test_what_a_killed_writer_wrote_last_is_read_whole(tmp_path):
    """A process SIGKILLed while it rewrites its progress as fast as it can leaves a file
    that parses, with one of the states it wrote."""
    script = ('import sys\n'
              'from mmddp_ext.diagnose.records import ProgressFile, begin_progress\n'
              'p = ProgressFile(begin_progress(sys.argv[1], 0))\n'
              'i = 0\n'
              'while True:\n'
              '    p.write(dict(rank=0, completed_iter=i, pad="z" * (i % 700)))\n'
              '    if i == 1000:\n'
              '        print("writing", flush=True)\n'
              '    i += 1\n')
    proc = subprocess.Popen(
        [sys.executable, '-c', script, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == 'writing\n'
    proc.kill()
    proc.wait()
    state = read_ranks(str(tmp_path))[0]
    assert state['completed_iter'] >= 1000 and state['pad'] == 'z' * (state['completed_iter'] % 700)
