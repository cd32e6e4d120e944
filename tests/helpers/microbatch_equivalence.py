"""Run under ``torchrun --nproc_per_node 2``: MicrobatchDDP's step (split into micro-batches)
against MMEngine's DDP step on a model without batch statistics; writes ``<out>/rank{R}.json``.

Usage: ``torchrun --nproc_per_node 2 tests/helpers/microbatch_equivalence.py OUT_DIR``.
"""
import json
import os
import sys

import torch
import torch.distributed as dist
from mmengine.model import BaseModel, MMDistributedDataParallel
from mmengine.optim import OptimWrapper

from mmddp_ext.ddp.microbatch import MicrobatchDDP


class TinyRegressor(BaseModel):

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

    def forward(self, inputs, data_samples=None, mode='tensor'):
        x = torch.stack(inputs)
        out = self.net(x).squeeze(1)
        if mode == 'loss':
            return dict(loss_mse=((out - torch.stack(data_samples))**2).mean())
        return out


def step(wrapper_cls, batches, micro_batches=1):
    """Train ``batches`` (accumulation 2) from the same initial weights; the final weights
    and the logged losses."""
    torch.manual_seed(0)
    model = wrapper_cls(module=TinyRegressor(), device_ids=None)
    if micro_batches > 1:
        model.micro_batches = micro_batches
    optim = OptimWrapper(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), accumulative_counts=2)
    logs = [model.train_step(b, optim) for b in batches]
    return [p.detach().clone() for p in model.module.parameters()], logs


def _diff(a, b):
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def main() -> None:
    dist.init_process_group('gloo')
    rank = dist.get_rank()
    gen = torch.Generator().manual_seed(100 + rank)  # every rank its own data
    batches = [
        dict(
            inputs=list(torch.randn(6, 4, generator=gen)),
            data_samples=list(torch.randn(6, generator=gen))) for _ in range(4)
    ]
    initial, _ = step(MMDistributedDataParallel, [])
    ref, ref_logs = step(MMDistributedDataParallel, batches)
    whole, _ = step(MicrobatchDDP, batches)
    split, logs = step(MicrobatchDDP, batches, micro_batches=3)
    out = dict(
        moved=_diff(ref, initial), whole=_diff(ref, whole), split=_diff(ref, split),
        loss=max(abs(float(a['loss']) - float(b['loss'])) for a, b in zip(ref_logs, logs)),
        checksum=float(sum(p.sum() for p in split)))
    os.makedirs(sys.argv[1], exist_ok=True)
    with open(os.path.join(sys.argv[1], f'rank{rank}.json'), 'w') as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == '__main__':
    main()
