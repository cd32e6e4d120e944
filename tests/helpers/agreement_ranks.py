"""Run under ``torchrun --nproc_per_node 2``: the cross-rank out-of-memory agreement
(``ranks_out_of_memory``, an all-gather) with ranks that answer differently, and the batch
search driven through it with a different limit on every rank; writes ``<out>/rank{R}.json``.

Usage: ``torchrun --nproc_per_node 2 --standalone tests/helpers/agreement_ranks.py OUT_DIR
UPPER LIMITS``, LIMITS a JSON object ``{case: [limit of rank 0, limit of rank 1, ...]}`` (the
largest batch that fits on that rank alone).
"""
import json
import os
import sys

import torch.distributed as dist

from mmddp_ext.batch_finder.search import search_max_batch
from mmddp_ext.oom.ranks_out_of_memory import ranks_out_of_memory


def _search(upper, limit):
    """The search with ``fits`` = "it fitted on every rank" through the real agreement; also
    what this rank alone would have answered at each trial."""
    local = []

    def fits(batch):
        ok = batch <= limit
        local.append([batch, ok])
        return not ranks_out_of_memory(ok)

    result = search_max_batch(upper, fits, clock=lambda: 0.0)
    return dict(max_batch=result.max_batch, trials=[[t.batch, t.fits] for t in result.trials],
                local=local)


def main() -> None:
    dist.init_process_group('gloo')
    rank = dist.get_rank()
    upper, limits = int(sys.argv[2]), json.loads(sys.argv[3])
    out = dict(
        rank=rank, world=dist.get_world_size(), agree={
            'rank1_fails': ranks_out_of_memory(rank != 1),
            'rank0_fails': ranks_out_of_memory(rank != 0),
            'all_fit': ranks_out_of_memory(True),
            'all_fail': ranks_out_of_memory(False),
        }, search={
            case: _search(upper, per_rank[rank])
            for case, per_rank in limits.items()
        })
    os.makedirs(sys.argv[1], exist_ok=True)
    with open(os.path.join(sys.argv[1], f'rank{rank}.json'), 'w') as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == '__main__':
    main()
