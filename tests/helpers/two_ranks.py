"""Two real gloo ranks, each a process of its own forked from the preloaded stack
(``tests/preloaded.py``), run one module-level function: ``two_ranks(tmp_path, fn, *args)``
returns ``{rank: what fn(rank, *args) returned}`` (or the text of what it raised, under
``'error'``)."""
import os.path as osp
import traceback
import uuid
from datetime import timedelta
from typing import Any, Callable, Dict

import torch
import torch.distributed as dist

from preloaded import fork_server


def _rank(rank: int, tmp: str, store: str, fn: Callable, args: tuple) -> None:
    result: Dict[str, Any] = {}
    try:
        dist.init_process_group('gloo', init_method=f'file://{store}', rank=rank, world_size=2,
                                timeout=timedelta(seconds=120))
        result['value'] = fn(rank, *args)
        dist.destroy_process_group()
    except Exception as e:  # the parent reads what went wrong
        result['error'] = f'{type(e).__name__}: {e}\n{traceback.format_exc()}'
    torch.save(result, osp.join(tmp, f'rank{rank}.pt'))


def two_ranks(tmp_path, fn: Callable, *args: Any) -> Dict[int, Any]:
    tmp = str(tmp_path)
    ctx = fork_server()
    store = osp.join(tmp, f'store-{uuid.uuid4().hex}')  # a new one for every call
    procs = [ctx.Process(target=_rank, args=(r, tmp, store, fn, args)) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
        assert p.exitcode == 0, f'a rank did not finish in 300 s (exit {p.exitcode})'
    out = {r: torch.load(osp.join(tmp, f'rank{r}.pt')) for r in (0, 1)}
    for r, result in out.items():
        assert 'error' not in result, f'rank {r}: {result["error"]}'
    return {r: result['value'] for r, result in out.items()}
