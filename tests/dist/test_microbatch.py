"""MicrobatchDDP's back-off, deterministic: one gloo process and a model that raises torch's
real out-of-memory exception above a batch size (what a GPU would do)."""
import pytest
import torch
import torch.distributed as dist
from mmengine.model import BaseModel
from mmengine.optim import OptimWrapper

from mmddp_ext.dist.microbatch import MicrobatchDDP


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
        self.seen += len(inputs)               # a buffer a failed attempt must not change
        if len(inputs) > self.limit:
            raise torch.OutOfMemoryError(f'CUDA out of memory. Tried to allocate {len(inputs)}')
        out = self.linear(torch.stack(inputs)).squeeze(1)
        return dict(loss=((out - torch.stack(data_samples)) ** 2).mean())


@pytest.fixture
def group(tmp_path):
    dist.init_process_group('gloo', init_method=f'file://{tmp_path}/store', rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


def _batch(n):
    gen = torch.Generator().manual_seed(n)
    return dict(inputs=list(torch.randn(n, 3, generator=gen)),
                data_samples=list(torch.randn(n, generator=gen)))


def _train(limit, batches, accumulation=1):
    torch.manual_seed(0)
    model = MicrobatchDDP(module=FitsUpTo(limit), device_ids=None)
    optim = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1),
                         accumulative_counts=accumulation)
    for b in batches:
        model.train_step(b, optim)
    return model


def test_backs_off_by_halving_and_keeps_the_result(group):
    whole = _train(100, [_batch(10)])
    split = _train(3, [_batch(10)])
    assert split.module.sizes == [10, 5, 3, 3, 2, 2]   # 1 → 2 → 4 micro-batches
    assert (split.micro_batches, split.redone) == (4, 2)
    assert whole.module.sizes == [10] and whole.micro_batches == 1
    for a, b in zip(whole.module.parameters(), split.module.parameters()):
        assert torch.allclose(a, b, atol=1e-6)
    assert split.module.seen.item() == 10               # buffers restored before each redo


def test_stays_split_and_redoes_the_whole_accumulation_cycle(group):
    model = _train(4, [_batch(6), _batch(6), _batch(8)], accumulation=2)
    # cycle 1: 6 fails, redone as 3 + 3; iteration 2 of the cycle already split;
    # cycle 2 (batch 8): 4 + 4 fit at 2 micro-batches
    assert model.module.sizes == [6, 3, 3, 3, 3, 4, 4]
    reference = _train(100, [_batch(6), _batch(6), _batch(8)], accumulation=2)
    for a, b in zip(reference.module.parameters(), model.module.parameters()):
        assert torch.allclose(a, b, atol=1e-6)


def test_gives_up_at_one_sample_with_the_fix(group):
    with pytest.raises(torch.OutOfMemoryError, match=r'rank\(s\) \[0\] even with micro-batches '
                                                     r'of 1 sample.*memory_budget_mib'):
        _train(0, [_batch(4)])


def test_other_errors_are_not_retried(group):
    class Broken(FitsUpTo):
        def forward(self, *args, **kwargs):
            raise ValueError('shape mismatch')

    model = MicrobatchDDP(module=Broken(10), device_ids=None)
    optim = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match='shape mismatch'):
        model.train_step(_batch(4), optim)
    assert model.micro_batches == 1
