"""Run under ``torchrun --nproc_per_node 2``: :class:`MicrobatchDDP` with out-of-memory errors
injected per rank, deterministically: the model's forward raises the allocator's real
exception when its micro-batch has more samples than that rank's limit. Every scenario is also
trained with MMEngine's plain DDP (one pass per batch, no limit) from the same weights on the
same data; writes ``<out>/rank{R}.json`` = ``{scenario: record}``.

Usage: ``torchrun --nproc_per_node 2 --standalone tests/helpers/microbatch_oom_ranks.py OUT_DIR
SCENARIOS``, SCENARIOS a JSON list of ``{"name", "limits": [rank 0, rank 1] (null: none),
"error": "cuda" | "cpu", "batches": [samples per batch, ...], "accumulation"}``.

A scenario whose ranks stop meeting in the same collective (one steps the optimizer, the other
goes on to the next iteration) fails after ``COLLECTIVE_TIMEOUT`` instead of hanging: its
record is ``{"error": ...}`` and the scenarios after it are not run.
"""
import hashlib
import json
import logging
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from mmengine.logging import MMLogger
from mmengine.model import BaseModel, MMDistributedDataParallel
from mmengine.optim import OptimWrapper

from mmddp_ext.ddp.microbatch import MicrobatchDDP

COLLECTIVE_TIMEOUT = 60  # seconds: only a hang guard; every collective here takes milliseconds

# the messages torch's allocators raise (CUDA caching allocator; CPU allocator, as a
# RuntimeError)
ERRORS = {
    'cuda':
    lambda n: torch.OutOfMemoryError(
        'CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of '
        f'23.64 GiB of which 1.06 MiB is free. (injected at {n} samples)'),
    'cpu':
    lambda n: RuntimeError(
        "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you "
        f'tried to allocate 16777216 bytes. Error code 12 (Cannot allocate memory) '
        f'(injected at {n} samples)'),
}


class FitsUpTo(BaseModel):
    """A small regressor that runs out of memory on more than ``limit`` samples."""

    def __init__(self, limit, error: str) -> None:
        super().__init__()
        self.limit, self.error = limit, error
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        self.register_buffer('seen', torch.zeros((), dtype=torch.float64))
        self.sizes = []

    def forward(self, inputs, data_samples=None, mode='tensor'):
        self.sizes.append(len(inputs))
        self.seen += len(inputs)  # a buffer a failed attempt must not change
        if self.limit is not None and len(inputs) > self.limit:
            raise ERRORS[self.error](len(inputs))
        out = self.net(torch.stack(inputs)).squeeze(1)
        if mode == 'loss':
            return dict(loss_mse=((out - torch.stack(data_samples))**2).mean())
        return out


class Collect(logging.Handler):

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record) -> None:
        self.messages.append(record.getMessage())


def _train(wrapper_cls, limit, error, batches, accumulation):
    torch.manual_seed(0)
    model = wrapper_cls(module=FitsUpTo(limit, error), device_ids=None)
    optim = OptimWrapper(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), accumulative_counts=accumulation)
    losses = [float(model.train_step(b, optim)['loss'].detach()) for b in batches]
    return model, losses


def _params(model):
    return [p.detach().clone() for p in model.module.parameters()]


def _digest(params):
    h = hashlib.sha256()
    for p in params:
        h.update(p.contiguous().numpy())
    return h.hexdigest()


def _diff(a, b):
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def run_scenario(index, spec, rank, collect):
    gen = torch.Generator().manual_seed(1000 * rank + index)  # every rank its own data
    batches = [
        dict(
            inputs=list(torch.randn(n, 4, generator=gen)),
            data_samples=list(torch.randn(n, generator=gen))) for n in spec['batches']
    ]
    initial = _params(_train(MMDistributedDataParallel, None, 'cuda', [], 1)[0])
    ref, ref_losses = _train(MMDistributedDataParallel, None, 'cuda', batches, spec['accumulation'])
    collect.messages.clear()
    model, losses = _train(MicrobatchDDP, spec['limits'][rank], spec['error'], batches,
                           spec['accumulation'])
    params = _params(model)
    return dict(sizes=model.module.sizes, micro_batches=model.micro_batches, redone=model.redone,
                logs=list(collect.messages), digest=_digest(params),
                checksum=float(sum(p.sum() for p in params)), seen=float(model.module.seen),
                moved=_diff(_params(ref), initial), diff=_diff(_params(ref), params),
                loss_diff=max(abs(a - b) for a, b in zip(ref_losses, losses)))


def main() -> None:
    dist.init_process_group('gloo', timeout=timedelta(seconds=COLLECTIVE_TIMEOUT))
    rank = dist.get_rank()
    collect = Collect()
    MMLogger.get_instance('microbatch_oom_ranks').addHandler(collect)  # the current logger
    out, broken = {}, False
    for i, spec in enumerate(json.loads(sys.argv[2])):
        try:
            out[spec['name']] = run_scenario(i, spec, rank, collect)
        except Exception as e:  # noqa: B902 - recorded for the test to report
            out[spec['name']] = dict(error=f'{type(e).__name__}: {e}'[:3000])
            broken = True
            break
    os.makedirs(sys.argv[1], exist_ok=True)
    with open(os.path.join(sys.argv[1], f'rank{rank}.json'), 'w') as f:
        json.dump(out, f)
    if broken:  # the process group is out of step: leave without another collective
        sys.stdout.flush()
        os._exit(0)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == '__main__':
    main()
