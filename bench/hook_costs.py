"""What each of our hooks costs per training iteration, measured in the training processes.

Trains the demo on 2 processes (``bash tools/dist_train.sh``, gloo on CPUs) with the hooks
``DDPRunner`` adds, at their default intervals, plus ``HookCostProbe`` (defined here, imported
through ``custom_imports``): before the run it wraps every method of each of our hooks (and the
forward timers of ``RankMemoryHook``) in a timer; after it, each rank writes the seconds
spent in each hook during the training iterations and the iteration times. The cost of a hook
is its time in per-iteration calls (``before/after_train_iter``, the forward timers, and the
epoch calls) divided by the iterations: µs per iteration, at its configured interval (so
``RankMemoryHook``'s gather every 50 iterations is averaged over 50; the log processor's
exchange of the ranks' losses on the lines ``LoggerHook`` logs, likewise); it is reported as a
fraction of the median iteration time of the same run. One-off calls (``before_train``:
the agreement check) are reported apart.

    python bench/hook_costs.py [--images 320] [--epochs 12]

Raw numbers: ``bench/results/hook_costs.json``; the table is in docs/benchmarks.md.
"""
import argparse
import glob
import json
import os
import os.path as osp
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

from mmengine.hooks import Hook
from mmengine.registry import HOOKS

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
OUT = osp.join(ROOT, 'bench', 'results', 'hook_costs.json')
OURS = ('AgreementHook', 'ScalingHook', 'RankMemoryHook', 'FiniteLossHook', 'HangWatchdogHook',
        'PreemptionHook', 'SyncBuffersHook', 'GlobalLossHook', 'GlobalLossLogProcessor')
PER_ITER = ('before_train_iter', 'after_train_iter', 'before_train_epoch', 'after_train_epoch',
            '_forward_begins', '_forward_ends', 'all_gather', 'over_ranks')
ONE_OFF = ('before_run', 'before_train', 'after_train', 'after_run')


@HOOKS.register_module()
class HookCostProbe(Hook):
    """Times every call of our hooks' methods; writes ``<work_dir>/hook_costs_rank{R}.json``."""

    priority = 'HIGHEST'

    def __init__(self) -> None:
        self.seconds = defaultdict(float)
        self.calls = defaultdict(int)
        self.iter_ends = []

    def before_run(self, runner) -> None:
        for hook in runner.hooks:
            name = type(hook).__name__
            if name in OURS:
                for method in PER_ITER + ONE_OFF:
                    if method in type(hook).__dict__:
                        self._wrap(hook, name, method)
                if name == 'RankMemoryHook':
                    for method in ('_forward_begins', '_forward_ends'):
                        self._wrap(hook.clock, name, method)
        if type(runner.log_processor).__name__ == 'GlobalLossLogProcessor':
            # what the global loss adds to the stock processor: the mean, on the lines
            # LoggerHook logs (the module's function, looked up at each call)
            from mmddp_ext.runner import global_loss
            self._wrap(global_loss, 'GlobalLossLogProcessor', 'over_ranks')
        # The hooks' collectives wait for the later rank, which DDP's next all-reduce would
        # wait for anyway: a barrier before each takes that wait, kept apart as skew and taken
        # out of the hook's time, so what is counted is what the collective adds. The
        # collective's own time is kept for the record ('exchange': not a method of the table,
        # so not counted twice). The modules' functions are looked up at each call.
        import mmengine.hooks.sync_buffer_hook as sync_buffers

        from mmddp_ext.hooks import memory_hook
        from mmddp_ext.runner import global_loss
        for module, function, hook in ((global_loss, 'all_gather', 'GlobalLossHook'),
                                       (memory_hook, 'all_gather_object', 'RankMemoryHook'),
                                       (sync_buffers, 'all_reduce_params', 'SyncBuffersHook')):
            self._align(module, function, hook)

    def _align(self, module, function: str, hook: str) -> None:
        collective = getattr(module, function)

        def aligned(*args, **kwargs):
            import torch.distributed as dist
            start = time.perf_counter()
            dist.barrier()
            self.seconds[f'skew.{hook}'] += time.perf_counter() - start
            start = time.perf_counter()
            try:
                return collective(*args, **kwargs)
            finally:
                self.seconds[f'{hook}.exchange'] += time.perf_counter() - start
                self.calls[f'{hook}.exchange'] += 1

        setattr(module, function, aligned)

    def _wrap(self, obj, name, method) -> None:
        inner, key = getattr(obj, method), f'{name}.{method}'

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[key] += time.perf_counter() - start
                self.calls[key] += 1

        setattr(obj, method, timed)

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self.iter_ends.append(time.perf_counter())

    def after_run(self, runner) -> None:
        with open(osp.join(runner.work_dir, f'hook_costs_rank{runner.rank}.json'), 'w') as f:
            json.dump(dict(seconds=self.seconds, calls=self.calls, iter_ends=self.iter_ends), f)


def _config(tmp: str, data: str, epochs: int) -> str:
    root = data.rstrip('/') + '/'
    path = osp.join(tmp, 'hook_costs.py')
    with open(path, 'w') as f:
        f.write(
            f"_base_ = [{osp.join(ROOT, 'configs/demo/td-hm_res18_1xb32-30e_demo-64x64.py')!r}]\n"
            "custom_imports = dict(imports=['mmddp_ext', 'bench.hook_costs'], "
            'allow_failed_imports=False)\n'
            "custom_hooks = [dict(type='HookCostProbe')]\n"
            f'data_root = {root!r}\n'
            f'train_dataloader = dict(dataset=dict(data_root={root!r}), num_workers=0, '
            'persistent_workers=False)\n'
            f'val_dataloader = dict(dataset=dict(data_root={root!r}))\n'
            f"val_evaluator = dict(ann_file={root + 'annotations/val.json'!r})\n"
            f'train_cfg = dict(max_epochs={epochs}, val_interval=1000)\n'
            'default_hooks = dict(checkpoint=dict(interval=1000))\n')
    return path


def _skew(rank: dict, hook: str = None) -> float:
    """Seconds one rank waited for the other before ``hook``'s collectives (all hooks' when
    None)."""
    return sum(s for k, s in rank['seconds'].items()
               if k.startswith('skew.') and (hook is None or k == f'skew.{hook}'))


def summarize(ranks: dict) -> dict:
    """Per hook, µs per iteration (mean over ranks) and % of the median iteration."""
    iters = {r: len(d['iter_ends']) for r, d in ranks.items()}
    gaps = [b - a for d in ranks.values() for a, b in zip(d['iter_ends'][3:], d['iter_ends'][4:])]
    iteration = statistics.median(gaps)
    table = {}
    for name in OURS:
        per_iter = statistics.mean(
            (sum(s for k, s in d['seconds'].items()
                 if k.split('.')[0] == name and k.split('.')[1] in PER_ITER) - _skew(d, name)) /
            iters[r] for r, d in ranks.items())
        one_off = max(
            sum(s for k, s in d['seconds'].items()
                if k.split('.')[0] == name and k.split('.')[1] in ONE_OFF) for d in ranks.values())
        table[name] = dict(us_per_iter=per_iter * 1e6, percent=100 * per_iter / iteration,
                           one_off_ms=one_off * 1e3)
    total = sum(v['us_per_iter'] for v in table.values())
    skew = statistics.mean(_skew(d) / iters[r] for r, d in ranks.items())
    return dict(iteration_s=iteration, iterations=iters, hooks=table, total_us_per_iter=total,
                total_percent=100 * total / 1e6 / iteration,
                skew_waited_before_collectives_us_per_iter=skew * 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--images', type=int, default=320)
    parser.add_argument('--epochs', type=int, default=12)
    args = parser.parse_args()
    sys.path.insert(0, ROOT)
    from mmddp_ext.demo import make_demo_dataset
    tmp = tempfile.mkdtemp(prefix='mmddp_hook_costs_')
    data = osp.join(tmp, 'data')
    make_demo_dataset(data, num_train=args.images, num_val=8, size=96)
    work = osp.join(tmp, 'work')
    env = dict(os.environ, OMP_NUM_THREADS='1',
               PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
    proc = subprocess.run(
        ['bash', 'tools/dist_train.sh',
         _config(tmp, data, args.epochs), '2', '--work-dir', work], cwd=ROOT, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        sys.exit(f'training failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}')
    ranks = {}
    for path in glob.glob(osp.join(work, 'hook_costs_rank*.json')):
        with open(path) as f:
            ranks[int(osp.basename(path)[len('hook_costs_rank'):-len('.json')])] = json.load(f)
    result = summarize(ranks)
    result['raw'] = ranks
    os.makedirs(osp.dirname(OUT), exist_ok=True)
    with open(OUT, 'w') as f:
        json.dump(result, f, indent=1)
    print(f'median iteration {result["iteration_s"] * 1000:.0f} ms over '
          f'{result["iterations"]} iterations per rank')
    for name, v in result['hooks'].items():
        print(f'{name:<18} {v["us_per_iter"]:9.1f} µs/iter  {v["percent"]:.4f}%  '
              f'one-off {v["one_off_ms"]:.1f} ms')
    print(f'{"all":<18} {result["total_us_per_iter"]:9.1f} µs/iter  '
          f'{result["total_percent"]:.4f}%')
    print(f'(waited for the other rank before the hooks\' collectives, not counted: '
          f'{result["skew_waited_before_collectives_us_per_iter"]:.1f} µs/iter)')


if __name__ == '__main__':
    main()
