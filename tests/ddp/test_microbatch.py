"""MicrobatchDDP's back-off, deterministic: a model that raises torch's real out-of-memory
exception above a batch size (what a GPU would do), in one gloo process and in two real gloo
processes whose limits differ."""
import json
import os.path as osp
import re

import pytest
import torch
import torch.distributed as dist
from mmengine.model import BaseModel
from mmengine.optim import OptimWrapper

from mmddp_ext.ddp.microbatch import MicrobatchDDP

from conftest import PYTHON, check_ok, mmengine_log, once, run


class FitsUpTo(BaseModel):
    """A linear regressor that runs out of memory on more than ``limit`` samples."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.linear = torch.nn.Linear(3, 1)
        self.register_buffer('seen', torch.zeros(()))
        self.sizes = []

    def forward(self, inputs, data_samples=None, mode='tensor'):
        self.sizes.append(len(inputs))
        self.seen += len(inputs)  # a buffer a failed attempt must not change
        if len(inputs) > self.limit:
            raise torch.OutOfMemoryError(f'CUDA out of memory. Tried to allocate {len(inputs)}')
        out = self.linear(torch.stack(inputs)).squeeze(1)
        return dict(loss=((out - torch.stack(data_samples))**2).mean())


@pytest.fixture
def group(tmp_path):
    dist.init_process_group('gloo', init_method=f'file://{tmp_path}/store', rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _batch(n):
    gen = torch.Generator().manual_seed(n)
    return dict(
        inputs=list(torch.randn(n, 3, generator=gen)),
        data_samples=list(torch.randn(n, generator=gen)))


def _train(limit, batches, accumulation=1):
    torch.manual_seed(0)
    model = MicrobatchDDP(module=FitsUpTo(limit), device_ids=None)
    optim = OptimWrapper(
        torch.optim.SGD(model.parameters(), lr=0.1), accumulative_counts=accumulation)
    for b in batches:
        model.train_step(b, optim)
    return model


def test_backs_off_by_halving_and_keeps_the_result(group):
    whole = _train(100, [_batch(10)])
    split = _train(3, [_batch(10)])
    assert split.module.sizes == [10, 5, 3, 3, 2, 2]  # 1 → 2 → 4 micro-batches
    assert (split.micro_batches, split.redone) == (4, 2)
    assert whole.module.sizes == [10] and whole.micro_batches == 1
    for a, b in zip(whole.module.parameters(), split.module.parameters()):
        assert torch.allclose(a, b, atol=1e-6)
    assert split.module.seen.item() == 10  # buffers restored before each redo


def test_stays_split_and_redoes_the_whole_accumulation_cycle(group):
    model = _train(4, [_batch(6), _batch(6), _batch(8)], accumulation=2)
    # cycle 1: 6 fails, redone as 3 + 3; iteration 2 of the cycle already split;
    # cycle 2 (batch 8): 4 + 4 fit at 2 micro-batches
    assert model.module.sizes == [6, 3, 3, 3, 3, 4, 4]
    reference = _train(100, [_batch(6), _batch(6), _batch(8)], accumulation=2)
    for a, b in zip(reference.module.parameters(), model.module.parameters()):
        assert torch.allclose(a, b, atol=1e-6)


def test_gives_up_at_one_sample_with_the_fix(group):
    with pytest.raises(
            torch.OutOfMemoryError, match=r'rank\(s\) \[0\] even with micro-batches '
            r'of 1 sample.*memory_budget_mib'):
        _train(0, [_batch(4)])


def test_the_batch_that_ran_out_is_described_and_logged(group):
    """What made the batch heavy (its images, largest shape, most objects) is kept for the
    failure record and said in the warning of the redo."""
    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData

    class IgnoresTargets(FitsUpTo):

        def forward(self, inputs, data_samples=None, mode='tensor'):
            if len(inputs) > self.limit:
                raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')
            return dict(loss=self.linear(torch.stack(inputs)).mean())

    samples = []
    for img_id in range(4):
        sample = DetDataSample(metainfo=dict(img_id=img_id, img_shape=(64 * (img_id + 1), 96)))
        sample.gt_instances = InstanceData(bboxes=torch.zeros(img_id * 3, 4))
        samples.append(sample)
    model = MicrobatchDDP(module=IgnoresTargets(2), device_ids=None)
    optim = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    with mmengine_log() as seen:
        model.train_step(dict(inputs=list(torch.randn(4, 3)), data_samples=samples), optim)
    assert model.failed_batch == dict(samples=[0, 1, 2, 3], shape=[256, 96], objects=9)
    said = '\n'.join(seen)
    assert 'this rank: 4 samples up to 96×256, 9 objects (images 0, 1, 2, 3)' in said


def test_other_errors_are_not_retried(group):

    class Broken(FitsUpTo):

        def forward(self, *args, **kwargs):
            raise ValueError('shape mismatch')

    model = MicrobatchDDP(module=Broken(10), device_ids=None)
    optim = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match='shape mismatch'):
        model.train_step(_batch(4), optim)
    assert model.micro_batches == 1


# Two ranks, each with its own data and its own limit (None: never out of memory); the errors
# are the allocators' own exceptions ('cuda': torch.OutOfMemoryError, 'cpu': the
# DefaultCPUAllocator RuntimeError).
SCENARIOS = [
    dict(name='rank1_cuda', limits=[None, 3], error='cuda', batches=[8, 8, 8], accumulation=1),
    dict(name='rank1_cpu', limits=[None, 3], error='cpu', batches=[8, 8, 8], accumulation=1),
    dict(name='both_ranks', limits=[5, 3], error='cpu', batches=[8, 8], accumulation=1),
    dict(name='cycle', limits=[None, 3], error='cuda', batches=[2, 6, 6, 6], accumulation=2),
]
# (micro-batches at the end, [(failed ranks, micro-batches of the redo), ...], forward sizes of
# rank 0, of rank 1), worked out by hand from the limits: a failure on any rank makes both
# ranks redo the step with twice the micro-batches.
EXPECTED = {
    # 8 fails on rank 1 (limit 3) → 2 × 4, fails again on rank 1 → 4 × 2 fits; stays at 4
    'rank1_cuda': (4, [([1], 2), ([1], 4)], [8, 4, 4] + [2] * 12, [8, 4] + [2] * 12),
    'rank1_cpu': (4, [([1], 2), ([1], 4)], [8, 4, 4] + [2] * 12, [8, 4] + [2] * 12),
    # 8 fails on both; 2 × 4 fits rank 0 (limit 5) only; 4 × 2 fits both
    'both_ranks': (4, [([0, 1], 2), ([1], 4)], [8, 4, 4] + [2] * 8, [8, 4] + [2] * 8),
    # accumulation 2: batch 2 fits, batch 6 fails on rank 1 → the whole cycle is redone as
    # 2 micro-batches (1 + 1, 3 + 3), and the next cycle stays split (3 + 3, 3 + 3)
    'cycle': (2, [([1], 2)], [2, 6, 1, 1] + [3] * 6, [2, 6, 1, 1] + [3] * 6),
}


@pytest.fixture(scope='module')
def two_ranks(tmp_path_factory):
    """``tests/helpers/microbatch_oom_ranks.py`` under torchrun, 2 gloo processes, once for
    the session."""

    def build(out: str) -> None:
        check_ok(
            run([
                PYTHON, '-m', 'torch.distributed.run', '--nproc_per_node', '2', '--standalone',
                'tests/helpers/microbatch_oom_ranks.py', out,
                json.dumps(SCENARIOS)
            ], timeout=300))

    out = once(tmp_path_factory, 'microbatch_ranks', build)
    return [json.load(open(osp.join(out, f'rank{r}.json'))) for r in (0, 1)]


def _redo_lines(logs):
    """``[(failed ranks, micro-batches), ...]`` from MicrobatchDDP's warnings."""
    found = [
        re.search(
            r'out of memory on rank\(s\) \[([\d, ]*)\] during a step; every rank '
            r'redoes it as (\d+) micro-batches', line) for line in logs
    ]
    return [([int(r) for r in m[1].split(',')], int(m[2])) for m in found if m]


@pytest.mark.slow
@pytest.mark.parametrize('name', [s['name'] for s in SCENARIOS])
def test_two_ranks_redo_the_step_together(two_ranks, name):
    spec = next(s for s in SCENARIOS if s['name'] == name)
    parts, redos, sizes0, sizes1 = EXPECTED[name]
    assert all(name in r for r in two_ranks), 'an earlier scenario broke the process group'
    recs = [r[name] for r in two_ranks]
    errors = {rank: rec['error'][:300] for rank, rec in enumerate(recs) if 'error' in rec}
    assert not errors, f'the ranks fell out of step: {errors}'
    assert [r['sizes'] for r in recs] == [sizes0, sizes1]
    for rank, rec in enumerate(recs):
        # both ranks redo with the same number of micro-batches, and say which rank failed
        assert (rec['micro_batches'], rec['redone']) == (parts, len(redos)), rank
        assert _redo_lines(rec['logs']) == redos, rec['logs']
        # the result is the un-split step's (MMEngine's DDP, one pass per batch, no limit)
        assert rec['moved'] > 1e-3  # training changed the weights at all
        assert rec['diff'] < 1e-6 and rec['loss_diff'] < 1e-5, rec
        assert rec['seen'] == sum(spec['batches'])  # buffers restored before each redo
    # the gradients were averaged over both ranks: the replicas are equal, bit for bit
    assert recs[0]['digest'] == recs[1]['digest']
    assert recs[0]['checksum'] == recs[1]['checksum']
