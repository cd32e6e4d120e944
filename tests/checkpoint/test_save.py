"""The one line of a checkpoint save that ran out of space (:func:`disk_full_error`) or that its
folder refused (:func:`refused_save_error`); the real ENOSPC is provoked in
``tests/e2e/test_diagnosis_cases.py``, the real EPERM in ``tests/e2e/test_faults.py``."""
import errno

import pytest

from mmddp_ext.checkpoint import REFUSED, disk_full_error, previous_checkpoint, refused_save_error


def test_the_line_names_the_path_the_free_space_and_the_previous_checkpoint():
    e = disk_full_error(
        OSError(errno.ENOSPC, 'No space left on device'), '/w/epoch_2.pth',
        (5 * 2**20, 1024 * 2**20), '/w/epoch_1.pth')
    assert e.errno == errno.ENOSPC
    assert str(e) == (
        '[Errno 28] no space left on device while saving checkpoint /w/epoch_2.pth: 5 MiB free '
        'of 1024 MiB there; the previous checkpoint /w/epoch_1.pth is intact, no partial file '
        'was left\nfix: free space there, keep fewer checkpoints (--cfg-options '
        'default_hooks.checkpoint.max_keep_ckpts=2), or give a --work-dir on a larger disk, '
        'then --resume')


def test_a_quota_and_a_first_save_say_so():
    text = str(
        disk_full_error(OSError(errno.EDQUOT, 'Disk quota exceeded'), '/w/a.pth', None, None))
    assert 'disk quota exceeded while saving checkpoint /w/a.pth; no earlier checkpoint' in text


def test_the_previous_checkpoint_is_the_one_last_checkpoint_names(tmp_path):
    assert previous_checkpoint(str(tmp_path)) is None
    ckpt = tmp_path / 'epoch_1.pth'
    ckpt.write_bytes(b'x')
    (tmp_path / 'last_checkpoint').write_text(str(ckpt))
    assert previous_checkpoint(str(tmp_path)) == str(ckpt)
    ckpt.unlink()  # named but gone: not called intact
    assert previous_checkpoint(str(tmp_path)) is None


@pytest.mark.parametrize('code, words', [
    (errno.EPERM, 'Operation not permitted'),
    (errno.EACCES, 'Permission denied'),
    (errno.EROFS, 'Read-only file system'),
    (errno.ENOENT, 'No such file or directory'),
])
def test_a_refused_save_names_the_folder_its_error_and_the_resume(code, words):
    assert code in REFUSED
    e = refused_save_error(
        OSError(code, words, '/w/.epoch_2.pth.part'), '/w/epoch_2.pth', '/w/epoch_1.pth')
    assert e.errno == code and isinstance(e, OSError)
    assert str(e) == (
        f'[Errno {code}] the work dir refused checkpoint /w/epoch_2.pth: {words} '
        '(/w/.epoch_2.pth.part); the previous checkpoint /w/epoch_1.pth is intact, no partial '
        'file was left\nfix: let /w take new files again (its permissions, a read-only mount, '
        "`lsattr -d` for an immutable folder, the export's or quota's rules), or give a "
        '--work-dir that does, then --resume /w/epoch_1.pth')


def test_a_refused_first_save_resumes_from_nothing():
    text = str(refused_save_error(OSError(errno.EACCES, 'Permission denied'), '/w/a.pth', None))
    assert 'no earlier checkpoint' in text and text.endswith('then --resume')


def test_a_failed_save_gets_the_line_of_its_cause(tmp_path):
    from mmddp_ext.checkpoint import save_error
    path = str(tmp_path / 'epoch_2.pth')
    full = save_error(OSError(errno.ENOSPC, 'No space left on device'), path)
    assert f'no space left on device while saving checkpoint {path}: ' in str(full)
    assert ' MiB free of ' in str(full)  # the disk of tmp_path, read
    refused = save_error(OSError(errno.EROFS, 'Read-only file system', path + '.part'), path)
    assert str(refused).startswith(f'[Errno {errno.EROFS}] the work dir refused checkpoint')
    assert save_error(OSError(errno.EIO, 'I/O error'), path) is None  # raised as it is
    assert save_error(RuntimeError('not a file system error'), path) is None
