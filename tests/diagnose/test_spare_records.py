"""Records a work dir refuses (``mmddp_ext/diagnose/spare_records.py``): the real
``record_failure`` and ``ProgressFile`` against a work dir that cannot be made (its parent is a
file: ENOTDIR) and a progress file that takes no byte (``/dev/full``: ENOSPC); the diagnosis
reads them from the spare folder and says where they went. Real refusals mid-run:
tests/e2e/test_faults.py (EPERM), tests/e2e/test_diagnosis_cases.py (ENOSPC)."""
import os
import os.path as osp
import tempfile

import pytest

from mmddp_ext.diagnose.records import (ProgressFile, clear_failure, read_failures, read_ranks,
                                        record_failure)
from mmddp_ext.diagnose.spare_records import spare_dir
from mmddp_ext.diagnose.summary import summarize


@pytest.fixture
def tmpdir_of_host(tmp_path, monkeypatch):
    """$TMPDIR of this test's own: the spare folders go there."""
    path = tmp_path / 'host_tmp'
    path.mkdir()
    monkeypatch.setattr(tempfile, 'tempdir', str(path))
    return str(path)


@pytest.fixture
def refusing_work_dir(tmp_path):
    (tmp_path / 'a_file').write_text('')
    return str(tmp_path / 'a_file' / 'w')  # makedirs there: NotADirectoryError


def _raised(exc):
    try:
        raise exc
    except Exception as e:
        return e


def test_the_spare_folder_is_per_work_dir_under_tmpdir(tmpdir_of_host, tmp_path):
    a, b = spare_dir(str(tmp_path / 'x' / 'w')), spare_dir(str(tmp_path / 'y' / 'w'))
    assert a != b and a == spare_dir(str(tmp_path / 'x' / 'w'))
    assert osp.dirname(osp.dirname(a)) == tmpdir_of_host and osp.basename(a).startswith('w-')


def test_a_refused_failure_record_is_kept_and_named(tmpdir_of_host, refusing_work_dir):
    path = record_failure(refusing_work_dir, 1, _raised(ValueError('bad sample 17')))
    assert path.startswith(spare_dir(refusing_work_dir)) and osp.isfile(path)
    [record] = read_failures(refusing_work_dir)
    refused = record['work_dir_error']
    assert refused['work_dir'] == refusing_work_dir and refused['kept_in'] == spare_dir(
        refusing_work_dir)
    assert refused['error'].startswith('NotADirectoryError: [Errno 20]')
    assert osp.isfile(record['traceback_file'])
    text = summarize(refusing_work_dir, launch=[])
    assert 'first failing rank: 1' in text and 'ValueError: bad sample 17' in text
    assert (f"rank 1's records: the work dir {refusing_work_dir} refused them "
            f"(NotADirectoryError: [Errno 20] Not a directory: ") in text
    assert f'kept in {spare_dir(refusing_work_dir)} on host ' in text
    assert 'no rank raised' not in text
    clear_failure(refusing_work_dir, 1)  # a new run: the spare record is stale news
    assert read_failures(refusing_work_dir) == []


def test_a_newer_record_in_either_place_wins(tmpdir_of_host, tmp_path):
    work = str(tmp_path / 'w')
    record_failure(work, 0, _raised(ValueError('old')))
    os.makedirs(osp.join(spare_dir(work), 'failures'))
    record_failure(spare_dir(work), 0, _raised(ValueError('new')))  # later: the spare one
    [record] = read_failures(work)
    assert record['message'] == 'new'


def test_a_refused_progress_write_moves_to_the_spare_folder(tmpdir_of_host, tmp_path):
    work = str(tmp_path / 'w')
    progress = ProgressFile('/dev/full', work)  # every write: ENOSPC
    progress.write(dict(rank=3, completed_iter=7, run='r'))
    progress.write(dict(rank=3, completed_iter=8, run='r'))
    assert progress.path == osp.join(spare_dir(work), 'ranks', 'rank3.json')
    state = read_ranks(work)[3]
    assert state['completed_iter'] == 8
    assert state['work_dir_error']['error'].startswith('OSError: [Errno 28]')
    progress.close()


def test_without_a_work_dir_a_refused_progress_write_raises():
    with pytest.raises(OSError):
        ProgressFile('/dev/full').write(dict(rank=0))
