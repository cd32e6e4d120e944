"""The local checkpoint loader keeps weights_only=True and allows MMEngine's own types only."""
import os

import numpy as np
import pytest
import torch
from mmengine.logging import HistoryBuffer
from mmengine.runner import CheckpointLoader

from mmddp_ext.checkpoint import load_checkpoint_file, load_from_local_safe


def test_mmengine_uses_the_safe_loader_for_local_files():
    assert CheckpointLoader._get_checkpoint_loader('/x/epoch_1.pth') is load_from_local_safe


def test_loads_what_mmengine_checkpoints_hold(tmp_path):
    buf = HistoryBuffer()
    buf.update(0.5)
    ckpt = dict(
        meta=dict(
            dataset_meta=dict(
                sigmas=np.array([0.026, 0.025], np.float32), flip=np.arange(3), score=np.float64(
                    0.3))), message_hub=dict(log_scalars={'train/loss': buf}),
        state_dict={'w': torch.ones(2)})
    path = str(tmp_path / 'c.pth')
    torch.save(ckpt, path)
    out = CheckpointLoader.load_checkpoint(path, map_location='cpu')
    np.testing.assert_array_equal(out['meta']['dataset_meta']['sigmas'],
                                  ckpt['meta']['dataset_meta']['sigmas'])
    assert out['message_hub']['log_scalars']['train/loss'].current() == 0.5
    assert torch.equal(out['state_dict']['w'], torch.ones(2))


class _RunsACommand:

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f'touch {self.marker}', ))


def test_refuses_a_checkpoint_that_runs_code(tmp_path):
    marker = tmp_path / 'pwned'
    path = str(tmp_path / 'evil.pth')
    torch.save({'state_dict': {}, 'x': _RunsACommand(marker)}, path, pickle_protocol=2)
    with pytest.raises(RuntimeError, match='refusing to load checkpoint.*(system|posix)'):
        load_checkpoint_file(path)
    assert not marker.exists()
    # the same file does run the command under plain pickle rules: the test is meaningful
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match='nope.pth'):
        load_checkpoint_file(str(tmp_path / 'nope.pth'))


class _GetattrOther:

    def __reduce__(self):  # getattr on an allowlisted class, but not a statistics method
        return (getattr, (HistoryBuffer, '__init__'))


def test_getattr_is_allowed_only_for_history_buffer_methods(tmp_path):
    path = str(tmp_path / 'getattr.pth')
    torch.save({'x': _GetattrOther()}, path)
    with pytest.raises(Exception, match='only HistoryBuffer statistics methods'):
        load_checkpoint_file(path)


class LegacyThing:
    """A plain object an old checkpoint might hold (not in the allowlist)."""

    def __init__(self):
        self.value = 42


def test_legacy_checkpoint_needs_the_explicit_opt_in(tmp_path, monkeypatch):
    from mmddp_ext.checkpoint import UNSAFE_ENV
    path = str(tmp_path / 'legacy.pth')
    torch.save({'meta': {'thing': LegacyThing()}}, path)
    with pytest.raises(RuntimeError, match='LegacyThing.*--unsafe-load'):
        load_checkpoint_file(path)
    monkeypatch.setenv(UNSAFE_ENV, '1')
    with pytest.warns(UserWarning, match='weights_only=False'):
        out = load_checkpoint_file(path)
    assert out['meta']['thing'].value == 42
