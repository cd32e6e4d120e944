"""A test-only hook: /proc's own memory counters read right beside each reading of
:class:`~mmddp_ext.hooks.RankMemoryHook`, so that a test compares what the hook logged with an
independent reading taken at the same point (no psutil, no ``getrusage``).

Wraps the RankMemoryHook's reader once training starts: every ``read`` is bracketed by two
readings of ``VmRSS`` and ``VmHWM`` from ``/proc/self/status``, appended as
``{"iter", "rss", "peak_rss", "rss_low", "rss_high", "hwm_low", "hwm_high"}`` to
``<out_dir>/beside_rank{R}.jsonl``.
"""
import json
import os
import os.path as osp

from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from mmddp_ext.hooks import RankMemoryHook

from tests.helpers.proc_status import proc_status


@HOOKS.register_module()
class ReadBesideHook(Hook):
    """Args:
        out_dir: where ``beside_rank{R}.jsonl`` goes.
    """

    priority = 'LOWEST'  # before_train after RankMemoryHook's: its reader exists

    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir

    def before_train(self, runner) -> None:
        hook = next(h for h in runner.hooks if isinstance(h, RankMemoryHook))
        reader, real = hook.reader, hook.reader.read
        os.makedirs(self.out_dir, exist_ok=True)
        path = osp.join(self.out_dir, f'beside_rank{runner.rank}.jsonl')

        def read(it):
            low = proc_status('VmRSS', 'VmHWM')
            sample = real(it)
            high = proc_status('VmRSS', 'VmHWM')
            with open(path, 'a') as f:
                f.write(
                    json.dumps(
                        dict(iter=sample.iter, rss=sample.rss, peak_rss=sample.peak_rss,
                             rss_low=low['VmRSS'], rss_high=high['VmRSS'], hwm_low=low['VmHWM'],
                             hwm_high=high['VmHWM'])) + '\n')
            return sample

        reader.read = read
