"""Validation on several ranks sees one model: the ranks train on different data, so their
BatchNorm running statistics drift apart (DDP does not sync buffers at every forward, as in
MMEngine); ``DDPRunner``'s default ``sync_buffers`` key (MMEngine's own ``SyncBuffersHook``)
averages them at the end of each training epoch, so every rank validates with the same
buffers. ``default_hooks.sync_buffers=None`` shows the drift it removes. 2 ranks started by hand
from the preloaded stack (``tests/preloaded.py``)."""
import json
import os.path as osp

import pytest

from conftest import DEMO_CONFIG, check_ok, demo_options
from preloaded import dist_train


def _config(tmp_path, out: str) -> str:
    path = str(tmp_path / 'demo_buffers.py')
    with open(path, 'w') as f:  # no SyncBuffersHook of the config's own
        f.write(f'_base_ = [{DEMO_CONFIG!r}]\n'
                "custom_imports = dict(imports=['mmddp_ext', 'tests.helpers.buffer_digest'], "
                'allow_failed_imports=False)\n'
                f"custom_hooks = [dict(type='BufferDigest', out_dir={out!r})]\n")
    return path


def _buffers(out: str, rank: int) -> dict:
    with open(osp.join(out, f'rank{rank}.json')) as f:
        return json.load(f)


@pytest.mark.slow
@pytest.mark.parametrize('synced', [True, False])
def test_every_rank_validates_with_the_same_buffers(demo_data, tmp_path, synced):
    out = str(tmp_path / 'buffers')
    options = demo_options(demo_data, 1, validate=True)
    if not synced:
        options.append('default_hooks.sync_buffers=None')
    check_ok(
        dist_train([_config(tmp_path, out), '--work-dir',
                    str(tmp_path / 'w'), *options], 2, str(tmp_path / 'ranks')))
    ranks = _buffers(out, 0), _buffers(out, 1)
    assert ranks[0] and ranks[0].keys() == ranks[1].keys()
    differing = [name for name in ranks[0] if ranks[0][name] != ranks[1][name]]
    if synced:
        assert differing == []
    else:  # the drift the default removes: the running statistics of BatchNorm layers
        assert any('running_' in name for name in differing), differing
