"""A test-only hook: one rank gets stuck or killed at a given iteration, as in the field."""
import json
import os
import os.path as osp
import signal
import time

from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class FaultHook(Hook):
    """On ``rank``, at training iteration ``at_iter`` (1-based, as the log counts), before the
    iteration runs: ``'stuck'`` sleeps (the other ranks reach the gradient all-reduce and wait),
    ``'sigkill'`` first writes ``<work_dir>/fault_rank{R}.json`` (its pid and its DataLoader
    worker pids), then kills its own process with SIGKILL, as the host's OOM killer does;
    ``'raise'`` raises an ordinary exception (``ValueError``) from the line below;
    ``'kill_worker'`` kills one of its DataLoader workers with SIGKILL (as the host's OOM killer
    picks a worker) and writes its pid to ``<work_dir>/fault_rank{R}.json``; the rank goes on;
    ``'grow'`` first limits the memory cgroup named by ``$MMDDP_TEST_CGROUP`` (when set) to what
    the job uses at that moment plus 1 GiB, without swap, writes its pid and that limit there,
    then fills host memory 64 MiB at a time, up to 8 GiB (the cgroup's OOM killer ends it on
    the way), then raises.

    Args:
        rank: the rank that misbehaves.
        at_iter: the iteration, 1-based.
        fault: ``'stuck'``, ``'sigkill'``, ``'raise'``, ``'kill_worker'`` or ``'grow'``.
    """

    def __init__(self, rank: int = 1, at_iter: int = 3, fault: str = 'stuck') -> None:
        self.rank, self.at_iter, self.fault = rank, at_iter, fault

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if runner.rank != self.rank or runner.iter + 1 != self.at_iter:
            return
        if self.fault == 'stuck':
            time.sleep(3600)  # the line the diagnosis must name
        elif self.fault == 'sigkill':
            import psutil
            children = [c.pid for c in psutil.Process().children(recursive=True)]
            with open(osp.join(runner.work_dir, f'fault_rank{runner.rank}.json'), 'w') as f:
                json.dump(dict(pid=os.getpid(), workers=children), f)
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.fault == 'kill_worker':
            import psutil

            # torch names its workers' processes so (the rank's other child copies its stderr)
            worker = next(c for c in psutil.Process().children() if c.name() == 'pt_data_worker')
            with open(osp.join(runner.work_dir, f'fault_rank{runner.rank}.json'), 'w') as f:
                json.dump(dict(pid=os.getpid(), worker=worker.pid), f)
            worker.kill()
        elif self.fault == 'grow':
            import torch
            limit = _limit_cgroup(os.environ.get('MMDDP_TEST_CGROUP'))
            with open(osp.join(runner.work_dir, f'fault_rank{runner.rank}.json'), 'w') as f:
                json.dump(dict(pid=os.getpid(), limit=limit), f)
            held = [torch.ones(2**24) for _ in range(128)]  # 64 MiB each, written
            raise ValueError(f'{len(held) * 64} MiB held and not killed')
        elif self.fault == 'raise':
            raise ValueError(f'injected fault on rank {runner.rank} at iteration {self.at_iter}')


def _limit_cgroup(folder):
    """Limit the memory cgroup at ``folder`` (v2 or v1) to its usage now plus 1 GiB, without
    swap; returns the limit in bytes (None without a folder)."""
    if not folder:
        return None
    v2 = osp.exists(osp.join(folder, 'memory.max'))
    with open(osp.join(folder, 'memory.current' if v2 else 'memory.usage_in_bytes')) as f:
        limit = int(f.read()) + 2**30
    settings = ([('memory.max', limit),
                 ('memory.swap.max', 0)] if v2 else [('memory.limit_in_bytes', limit),
                                                     ('memory.memsw.limit_in_bytes', limit)])
    for name, value in settings:
        if osp.exists(osp.join(folder, name)):
            with open(osp.join(folder, name), 'w') as f:
                f.write(str(value))
    return limit
