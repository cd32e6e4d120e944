"""A test-only script: a process with a DataLoader of 2 worker processes, optionally tied to it
(:func:`mmddp_ext.dataloader.workers.tie_workers`); prints the worker pids, then waits to be killed,
or (``exit-tie``) exits with code 3 while its loader's iterator is alive, as a rank whose
loader raised does. ``term-tie`` and ``exit-tie`` hold SIGTERM as a training rank does: a
handler that only reports (as ``PreemptionHook``'s only records) and a faulthandler stack dump
chained before it (as ``HangWatchdogHook``'s), both set before the workers fork.

``term-tie`` (and ``term-plain``, untied) then loads two more batches for each ``next`` line
on its standard input and says so.

    python -m tests.helpers.loader_child tie|plain|term-tie|term-plain|exit-tie
"""
import faulthandler
import os
import signal
import sys
import time

import psutil
from torch.utils.data import DataLoader

from mmddp_ext.dataloader.workers import tie_workers


def seed_worker(worker_id: int) -> None:
    print(f'worker {worker_id} initialised', flush=True)


class _Big:

    def __len__(self) -> int:
        return 1000

    def __getitem__(self, index: int):
        import torch
        return torch.zeros(2**18)


def _report_sigterm(signum, frame) -> None:
    print(f'SIGTERM in {os.getpid()}, which goes on', flush=True)


def main(mode: str) -> None:
    if mode in ('term-tie', 'term-plain', 'exit-tie'):
        signal.signal(signal.SIGTERM, _report_sigterm)
        faulthandler.register(signal.SIGTERM, file=sys.stderr, all_threads=True, chain=True)
    # 1 MiB samples: prefetched batches fill the result pipe, as images do in training
    loader = DataLoader(_Big(), batch_size=1, num_workers=2, worker_init_fn=seed_worker)
    if mode.endswith('tie'):
        tie_workers(loader)
    global batches  # kept alive to the exit, as a traceback keeps a failed loop's iterator
    batches = iter(loader)
    # batch 0 comes from worker 0, batch 1 from worker 1 (round robin): after both, each worker
    # has run its init (and printed), however slowly a loaded machine started the second one
    next(batches)
    next(batches)
    print('workers', ' '.join(str(c.pid) for c in psutil.Process().children()), flush=True)
    if mode == 'exit-tie':
        sys.exit(3)
    if mode.startswith('term-'):
        for line in sys.stdin:
            if line.strip() == 'next':
                next(batches)
                next(batches)
                print('loaded 2 more batches', flush=True)
    time.sleep(600)


if __name__ == '__main__':
    main(sys.argv[1])
