"""A test-only hook: one rank holds once after a given training iteration, so that a test kills
it at an event (it is alive, mid-schedule, with iterations left) instead of after a guessed time.

* After every training iteration each rank appends ``{"iter", "epoch"}`` (counted from 1) to
  ``<flag_dir>/iters_rank{R}.jsonl``, across restarts: what was trained, once or twice.
* After training iteration ``iteration`` (counted from 1) rank ``rank`` writes
  ``<flag_dir>/held`` (``{"pid", "iter", "epoch"}``) and waits, at most ``bound`` seconds, for
  the test to kill it. Only once: a restarted worker that finds ``held`` goes on.
"""
import json
import os
import os.path as osp
import time

from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class HoldRankHook(Hook):
    """Args:
        rank: the rank that holds.
        iteration: hold after this training iteration (1-based).
        flag_dir: where the flag files go.
        bound: the longest wait, seconds; then it goes on (the test fails: nobody killed it).
    """

    priority = 'LOW'

    def __init__(self, rank: int, iteration: int, flag_dir: str, bound: float = 300.0) -> None:
        self.rank, self.iteration, self.flag_dir, self.bound = rank, iteration, flag_dir, bound

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        os.makedirs(self.flag_dir, exist_ok=True)
        done = dict(iter=runner.iter + 1, epoch=runner.epoch + 1)
        with open(osp.join(self.flag_dir, f'iters_rank{runner.rank}.jsonl'), 'a') as f:
            f.write(json.dumps(done) + '\n')
        held = osp.join(self.flag_dir, 'held')
        if runner.rank != self.rank or done['iter'] != self.iteration or osp.exists(held):
            return
        with open(held + '.part', 'w') as f:
            json.dump(dict(pid=os.getpid(), **done), f)
        os.replace(held + '.part', held)  # whole, or not there
        deadline = time.monotonic() + self.bound
        while time.monotonic() < deadline:
            time.sleep(0.05)


def read_iters(flag_dir: str, rank: int) -> list:
    """``[(iter, epoch), ...]`` that ``rank`` trained, in order, over all restarts."""
    with open(osp.join(flag_dir, f'iters_rank{rank}.jsonl')) as f:
        return [(r['iter'], r['epoch']) for r in map(json.loads, f)]
