"""A DataLoader worker moves its batch into shared memory itself (dataloader/shared_batches.py): the
batches a rank gets are the same, and a /dev/shm too small for them is an error in the rank
that names it, where torch's own worker drops the batch and the rank waits forever."""
import functools
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from mmengine.structures import InstanceData, PixelData
from torch.utils.data import DataLoader, default_collate

from mmddp_ext.dataloader.shared_batches import MESSAGE, SharedBatches, share_batch, share_batches
from mmddp_ext.diagnose.deaths import shared_memory_lines

from conftest import ROOT


def test_every_tensor_of_a_batch_goes_into_shared_memory_data_samples_included():
    sample = PixelData(heatmaps=torch.zeros(1, 2, 3))
    sample.set_field(InstanceData(keypoints=torch.ones(1, 4)), 'gt_instances')
    batch = dict(inputs=[torch.zeros(3, 8, 8), torch.ones(3, 8, 8)], data_samples=[sample],
                 meta=('a', 1, None))
    assert share_batch(batch) is batch
    tensors = batch['inputs'] + [sample.heatmaps, sample.gt_instances.keypoints]
    assert all(t.is_shared() for t in tensors)
    assert torch.equal(batch['inputs'][1], torch.ones(3, 8, 8))  # values kept


class _Numbers(torch.utils.data.Dataset):

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return dict(x=torch.full((4, ), float(i)), i=i)


def test_a_loader_with_workers_yields_the_same_batches():
    plain = list(DataLoader(_Numbers(), batch_size=3, num_workers=2))
    collate = functools.partial(default_collate)  # as MMEngine's build_dataloader makes it
    shared_loader = share_batches(
        DataLoader(_Numbers(), batch_size=3, num_workers=2, collate_fn=collate))
    assert isinstance(shared_loader.collate_fn, SharedBatches)
    assert shared_loader.collate_fn.func is default_collate  # MMEngine's partial, kept
    shared = list(shared_loader)
    assert len(plain) == len(shared) == 3
    for a, b in zip(plain, shared):
        assert torch.equal(a['x'], b['x']) and torch.equal(a['i'], b['i'])
    no_workers = DataLoader(_Numbers(), batch_size=3)
    assert share_batches(no_workers).collate_fn is no_workers.collate_fn  # nothing to hand over
    own = DataLoader(_Numbers(), batch_size=3, num_workers=2, collate_fn=default_collate)
    assert share_batches(own).collate_fn is default_collate  # a caller's callable: that object


# a worker's batch of 2 MiB (a list, so torch's default_collate does not put it in shared
# memory), a 1 MiB /dev/shm; the control is torch's own path, with a 20 s loader timeout
_PROGRAM = textwrap.dedent('''
    import functools, sys, torch
    from torch.utils.data import DataLoader
    from mmddp_ext.dataloader.shared_batches import share_batches
    class Big(torch.utils.data.Dataset):
        def __len__(self): return 4
        def __getitem__(self, i): return torch.zeros(512 * 1024)
    loader = DataLoader(Big(), batch_size=1, num_workers=1, collate_fn=functools.partial(list),
                        timeout=20)
    if sys.argv[1] == 'ours':
        share_batches(loader)
    try:
        next(iter(loader))
    except RuntimeError as e:
        print('RAISED', str(e).splitlines()[-1])
''')


def _small_shm(which: str) -> subprocess.CompletedProcess:
    script = 'mount -t tmpfs -o size=1m none /dev/shm && exec "$0" -c "$1" "$2"'
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
    return subprocess.run([
        'unshare', '-m', '--propagation', 'private', 'sh', '-c', script, sys.executable, _PROGRAM,
        which
    ], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.waits
def test_a_dev_shm_too_small_for_a_batch_is_an_error_in_the_rank_that_names_it():
    probe = subprocess.run(['unshare', '-m', '--propagation', 'private', 'true'],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip('no mount namespace here (unshare -m as root)')
    control = _small_shm('stock')
    assert 'DataLoader timed out' in control.stdout, control.stdout + control.stderr[-3000:]
    assert 'unable to allocate shared memory' in control.stderr  # printed, and the batch lost
    ours = _small_shm('ours')
    raised = [ln for ln in ours.stdout.splitlines() if ln.startswith('RAISED')]
    assert raised and MESSAGE in raised[0], ours.stdout + ours.stderr[-3000:]
    assert '/dev/shm on host' in raised[0] and 'has 1.00 MiB' in raised[0]
    assert 'for a batch of 2.00 MiB' in raised[0]
    lines = shared_memory_lines(raised[0])
    assert len(lines) == 2 and '--shm-size' in lines[1] and 'num_workers' in lines[1]
