"""runner/work_dir.py's collectives on two real gloo ranks (spawned processes). One machine's
ranks share every folder, so "a node that does not see it" is a rank given a folder of its own;
two nodes in mount namespaces of their own: tests/e2e/test_nothing_shared.py."""
import os
import os.path as osp
import socket

import pytest

from mmddp_ext.runner.work_dir import send_missing_file, unseen_by

from tests.helpers.two_ranks import two_ranks


def _look(rank: int, folders: list) -> dict:
    return unseen_by(folders[rank])


def _send(rank: int, paths: list) -> tuple:
    sent = send_missing_file(paths[rank])
    again = send_missing_file(paths[rank])  # now every rank has it: nothing to send
    return sent, again


@pytest.mark.slow
def test_a_rank_with_a_folder_of_its_own_is_named_with_its_host(tmp_path):
    own = two_ranks(tmp_path, _look, [str(tmp_path / 'a'), str(tmp_path / 'b')])
    assert own == {0: {1: socket.gethostname()}, 1: {1: socket.gethostname()}}
    shared = two_ranks(tmp_path, _look, [str(tmp_path / 'a')] * 2)
    assert shared == {0: {}, 1: {}}
    assert os.listdir(tmp_path / 'a') == []  # the check leaves nothing behind


@pytest.mark.slow
@pytest.mark.parametrize('content', [bytes(range(256)) * 4099, b''], ids=['1 MiB', 'empty'])
def test_rank_0s_file_reaches_the_rank_without_it_byte_for_byte(tmp_path, content):
    (tmp_path / 'a').mkdir()
    (tmp_path / 'a' / 'epoch_1.pth').write_bytes(content)
    paths = [str(tmp_path / 'a' / 'epoch_1.pth'), str(tmp_path / 'b' / 'epoch_1.pth')]
    out = two_ranks(tmp_path, _send, paths)
    assert out == {0: ([1], []), 1: ([1], [])}
    assert (tmp_path / 'b' / 'epoch_1.pth').read_bytes() == content
    assert sorted(os.listdir(tmp_path / 'b')) == ['epoch_1.pth']  # no temporary file left


@pytest.mark.slow
def test_nothing_is_sent_when_rank_0_lacks_the_file_too(tmp_path):
    paths = [str(tmp_path / 'a' / 'x.pth'), str(tmp_path / 'b' / 'x.pth')]
    assert two_ranks(tmp_path, _send, paths) == {0: ([], []), 1: ([], [])}
    assert not osp.exists(paths[1])
