"""A test-only hook that holds training at known points, so a test sends its signals at an event
instead of after a guessed time.

* After every training iteration each rank appends ``{"iter", "epoch", "ids"}`` (the
  iteration counted from 1, and the ``metainfo['id']`` of its samples) to
  ``<flag_dir>/iters_rank{R}.jsonl``, across runs: what was trained, once or twice.
* After training iteration ``iteration`` (counted from 1; 0: never) every rank writes
  ``<flag_dir>/paused_rank{R}`` and waits until ``<flag_dir>/go`` exists; while it waits it
  writes ``received_rank{R}`` once its :class:`~mmddp_ext.hooks.PreemptionHook` got a signal.
* With ``hold_save``, when the PreemptionHook's checkpoint is being saved (its
  ``before_save_checkpoint``, on rank 0 only: MMEngine saves there) rank 0 writes
  ``saving_rank0`` and waits until its PreemptionHook counts one more signal, then writes
  ``second_rank0`` and goes on.

Every wait is bounded (``bound`` seconds), then it goes on anyway.
"""
import json
import os
import os.path as osp
import time

from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from mmddp_ext.hooks import PreemptionHook


def _touch(path: str) -> None:
    with open(path, 'w') as f:
        f.write(str(os.getpid()))


@HOOKS.register_module()
class StopPointHook(Hook):
    """Args:
        iteration: hold after this iteration (1-based), once per run.
        flag_dir: where the flag files go.
        hold_save: also hold during the stop's checkpoint save until one more signal.
        bound: the longest wait, seconds.
    """

    priority = 'LOW'

    def __init__(self, iteration: int, flag_dir: str, hold_save: bool = False,
                 bound: float = 300.0) -> None:
        self.iteration, self.flag_dir, self.hold_save, self.bound = (iteration, flag_dir, hold_save,
                                                                     bound)

    def _preemption(self, runner) -> PreemptionHook:
        return next(h for h in runner.hooks if isinstance(h, PreemptionHook))

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        os.makedirs(self.flag_dir, exist_ok=True)
        ids = [int(s.metainfo['id']) for s in data_batch['data_samples']]
        with open(osp.join(self.flag_dir, f'iters_rank{runner.rank}.jsonl'), 'a') as f:
            f.write(json.dumps(dict(iter=runner.iter + 1, epoch=runner.epoch + 1, ids=ids)) + '\n')
        if runner.iter + 1 != self.iteration:
            return
        _touch(osp.join(self.flag_dir, f'paused_rank{runner.rank}'))
        hook, marked = self._preemption(runner), False
        deadline = time.monotonic() + self.bound
        while not osp.exists(osp.join(self.flag_dir, 'go')) and time.monotonic() < deadline:
            if hook.received is not None and not marked:
                _touch(osp.join(self.flag_dir, f'received_rank{runner.rank}'))
                marked = True
            time.sleep(0.05)

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        hook = self._preemption(runner)
        if not self.hold_save or hook.stopped is None:
            return
        before = hook.signal_count
        _touch(osp.join(self.flag_dir, f'saving_rank{runner.rank}'))
        deadline = time.monotonic() + self.bound
        while hook.signal_count == before and time.monotonic() < deadline:
            time.sleep(0.05)
        if hook.signal_count > before:
            _touch(osp.join(self.flag_dir, f'second_rank{runner.rank}'))


# ---- the tests' side ----
def hook_source(flag_dir: str, iteration: int, hold_save: bool = False) -> str:
    """This hook as ``custom_hooks`` items for ``conftest.demo_with_hooks`` (``iteration=0``:
    records only, never holds), with a PreemptionHook whose SIGTERM grace no loaded machine
    runs out of while the test holds it (the grace itself: tests/e2e/test_faults.py)."""
    return (f'dict(type="StopPointHook", iteration={iteration}, flag_dir={flag_dir!r}, '
            f'hold_save={hold_save}), dict(type="PreemptionHook", grace=600)')


# 64 images, global batch 8 (4 per rank on 2 ranks): 8 iterations per epoch, 2 epochs
STOP_OPTIONS = {
    'train_dataloader.batch_size': '4',
    'auto_scale_lr.base_batch_size': '8',
    'randomness.seed': '0'
}


def wait_for(paths, bound: float = 300.0, alive=lambda: True) -> None:
    """Poll until every path exists (or ``alive()`` turns False); AssertionError after
    ``bound`` seconds, naming what is missing."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        missing = [p for p in paths if not osp.exists(p)]
        if not missing:
            return
        assert alive(), f'the run ended while waiting for {missing}'
        time.sleep(0.1)
    raise AssertionError(f'not there after {bound:.0f} s: {missing}')


def job_processes(procs) -> list:
    """Every process of a job started as ``procs`` (Popen objects): each one, and all their
    descendants (torchrun, the ranks, their DataLoader workers)."""
    import psutil
    out = []
    for p in procs:
        top = psutil.Process(p.pid)
        out += [top] + top.children(recursive=True)
    return out


def trained_iterations(flag_dir: str, world: int) -> dict:
    """``{rank: [(iter, epoch, ids), ...]}`` in the order trained, over all runs."""
    out = {}
    for rank in range(world):
        with open(osp.join(flag_dir, f'iters_rank{rank}.jsonl')) as f:
            out[rank] = [(r['iter'], r['epoch'], tuple(r['ids'])) for r in map(json.loads, f)]
    return out
