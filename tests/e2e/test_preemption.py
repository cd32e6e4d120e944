"""A run told to stop (SIGTERM to one of its two ranks, started by hand) saves one checkpoint
after an iteration both ranks agree on and exits with 75; ``--resume`` continues at the next
batch of the same epoch: every iteration and sample is trained exactly once, as in a run that
was never stopped. A second signal during the save changes nothing. The same under
``tools/dist_train.sh`` (torchrun), with SIGTERM to its workers."""
import os
import os.path as osp
import signal

import pytest
import torch

from conftest import demo_options, demo_with_hooks, finish, popen, stop_point_by_hand
from tests.helpers.stop_point_hook import STOP_OPTIONS, hook_source, trained_iterations, wait_for

pytestmark = pytest.mark.slow

PER_EPOCH, EPOCHS = 8, 2


def test_sigterm_to_one_rank_stops_both_and_resume_trains_each_batch_once(
        stop_point_reference, demo_data, tmp_path):
    flags, work = str(tmp_path / 'flags'), str(tmp_path / 'w')
    config = demo_with_hooks(tmp_path, hook_source(flags, 10, hold_save=True), ['stop_point_hook'])
    procs = stop_point_by_hand(config, work, demo_data)
    alive = lambda: all(p.poll() is None for p in procs)  # noqa: E731
    wait_for([osp.join(flags, f'paused_rank{r}') for r in (0, 1)], alive=alive)
    procs[1].send_signal(signal.SIGTERM)  # rank 1 only: rank 0 learns it from the agreement
    wait_for([osp.join(flags, 'received_rank1')], alive=alive)
    open(osp.join(flags, 'go'), 'w').close()
    wait_for([osp.join(flags, 'saving_rank0')], alive=alive)  # rank 0 writes, rank 1 waits
    for p in procs:  # a second signal during the save
        p.send_signal(signal.SIGTERM)
    results = finish(procs)
    out = results[0][1]
    assert [rc for rc, _ in results] == [75, 75], out[-3000:]
    assert osp.exists(osp.join(flags, 'second_rank0'))  # it came, and the save went on
    # held after iteration 10 (its agreement already started), signalled then, in the
    # agreement started after 11, read after 12: batch 4 of epoch 2
    assert ('stopped by a signal to another rank after epoch 2, iteration 12 (4 of 8 in the '
            f'epoch): every rank finished it; saved {work}/iter_12.pth') in out
    assert 'continue with --resume (exit code 75: stopped, not failed)' in out
    assert 'Epoch(train) [2][5/8]' not in out  # no iteration after the agreed one
    ckpt = torch.load(osp.join(work, 'iter_12.pth'), map_location='cpu')  # whole, plain
    assert (ckpt['meta']['epoch'], ckpt['meta']['iter']) == (1, 12)
    assert open(osp.join(work, 'last_checkpoint')).read().strip() == osp.join(work, 'iter_12.pth')
    assert not osp.exists(osp.join(work, 'epoch_2.pth'))

    results = finish(stop_point_by_hand(config, work, demo_data, ['--resume']))
    out = results[0][1]
    assert [rc for rc, _ in results] == [0, 0], out[-3000:]
    assert 'resuming epoch 2 after batch 4 of 8: continuing at batch 5' in out
    assert 'Epoch(train) [2][5/8]' in out and 'Epoch(train) [2][4/8]' not in out
    trained = trained_iterations(flags, 2)
    for rank in (0, 1):  # the same iterations, with the same samples, each once
        assert [it for it, _, _ in trained[rank]] == list(range(1, PER_EPOCH * EPOCHS + 1))
        assert trained[rank] == stop_point_reference[rank]
    seen = sum(len(ids) for rank in trained for _, _, ids in trained[rank])
    reference = stop_point_reference
    assert seen == sum(len(ids) for rank in reference for _, _, ids in reference[rank]) == 128
    ckpt = torch.load(osp.join(work, 'epoch_2.pth'), map_location='cpu')
    assert ckpt['meta']['iter'] == PER_EPOCH * EPOCHS


def test_sigterm_under_dist_train_sh_exits_75_and_resume_continues(demo_data, tmp_path):
    flags, work = str(tmp_path / 'flags'), str(tmp_path / 'w')
    config = demo_with_hooks(tmp_path, hook_source(flags, 10), ['stop_point_hook'])
    cmd = [
        'bash', 'tools/dist_train.sh', config, '2', '--work-dir', work,
        *demo_options(demo_data, EPOCHS, **STOP_OPTIONS)
    ]
    proc = popen(cmd)
    alive = lambda: proc.poll() is None  # noqa: E731
    paused = [osp.join(flags, f'paused_rank{r}') for r in (0, 1)]
    wait_for(paused, alive=alive)
    for path in paused:  # the workers, as a container runtime would signal them
        os.kill(int(open(path).read()), signal.SIGTERM)
    wait_for([osp.join(flags, f'received_rank{r}') for r in (0, 1)], alive=alive)
    open(osp.join(flags, 'go'), 'w').close()
    [(rc, out)] = finish([proc])
    assert rc == 75, out[-3000:]
    assert 'stopped by SIGTERM after epoch 2, iteration 12 (4 of 8 in the epoch)' in out
    assert ('torchrun: the workers stopped on a signal after saving a checkpoint (exit code 75): '
            '--resume continues') in out
    assert '==== mmddp_ext diagnosis' not in out  # not a failure
    assert osp.isfile(osp.join(work, 'iter_12.pth'))
