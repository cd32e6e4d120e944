"""Reading faulthandler dumps (real ones, written by the interpreter) and telling the rank that
did not arrive from the ranks that wait in a collective."""
import faulthandler
import threading

import pytest

from mmddp_ext.diagnose.stacks import (Frame, main_frames, parse_dump, split_ranks, user_frame,
                                       wait_site)


def _blocked_here(ready: threading.Event, release: threading.Event) -> None:
    ready.set()
    release.wait()


def test_a_real_dump_is_parsed_per_thread(tmp_path):
    ready, release = threading.Event(), threading.Event()
    worker = threading.Thread(target=_blocked_here, args=(ready, release))
    worker.start()
    ready.wait()
    path = tmp_path / 'dump.txt'
    try:
        with open(path, 'w') as f:
            faulthandler.dump_traceback(file=f, all_threads=True)
    finally:
        release.set()
        worker.join()
    dump = parse_dump(path.read_text())
    assert dump.timeout is None  # not the watchdog's heading
    frames = dump.threads[worker.ident]
    assert frames[0].func == 'wait' and '_blocked_here' in [fr.func for fr in frames]
    assert user_frame(frames).func == '_blocked_here'  # threading.py is library code
    mine = main_frames(dump, threading.main_thread().ident)
    assert any(fr.func == 'test_a_real_dump_is_parsed_per_thread' for fr in mine)


def test_the_watchdog_heading_and_the_last_of_several_dumps():
    text = ('Thread 0x1 (most recent call first):\n  File "/a.py", line 1 in old\n'
            'Timeout (0:02:00)!\nThread 0x1 (most recent call first):\n'
            '  File "/a.py", line 2 in new\n')
    dump = parse_dump(text)
    assert dump.timeout == '0:02:00' and dump.threads == {1: [Frame('/a.py', 2, 'new')]}


SITE = '/venv/lib/python3.11/site-packages/'


@pytest.mark.parametrize(
    'inner,expected',
    [
        (SITE + 'torch/autograd/graph.py', "backward (DDP's gradient all-reduce)"),
        (SITE + 'torch/distributed/distributed_c10d.py', 'a torch.distributed collective'),
        (SITE + 'torch/nn/parallel/distributed.py', "DDP's forward (buffer broadcast)"),
        (SITE + 'mmengine/dist/dist.py', 'an MMEngine collective (mmengine.dist)'),
        (SITE + 'torch/utils/data/dataloader.py', None),  # waiting for data is not a collective
        ('/home/me/model.py', None),
    ])
def test_wait_sites(inner, expected):
    assert wait_site([Frame(inner, 1, 'f'), Frame('/home/me/train.py', 9, '<module>')]) == expected


def _frames(path):
    return [Frame(path, 10, 'f'), Frame('/home/me/train.py', 1, '<module>')]


def test_the_rank_outside_a_collective_did_not_arrive():
    stacks = {
        0: _frames(SITE + 'torch/autograd/graph.py'),
        1: _frames('/home/me/model.py'),
        2: _frames(SITE + 'torch/autograd/graph.py')
    }
    waiting, late = split_ranks(stacks, {0: 7, 1: 7, 2: 7})
    assert sorted(waiting) == [0, 2] and list(late) == [1]
    assert late[1].startswith('/home/me/model.py:10 in f')


def test_when_every_rank_waits_the_one_behind_did_not_arrive():
    """On GPUs collectives are asynchronous: every stack may sit at a synchronisation."""
    stacks = {r: _frames(SITE + 'torch/cuda/__init__.py') for r in range(3)}
    waiting, late = split_ranks(stacks, {0: 8, 1: 7, 2: 8})
    assert list(late) == [1] and sorted(waiting) == [0, 2]
    waiting, late = split_ranks(stacks, {0: 8, 1: 8, 2: 8})
    assert late == {} and sorted(waiting) == [0, 1, 2]  # cannot tell: says so
