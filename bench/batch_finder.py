"""What the batch finder costs, and what ``on_oom='microbatch'`` costs when nothing runs out.

Runs the 128×128 demo on 2 gloo processes, global batch 64, one after the other in one run:

* ``fixed``: per-device batch 16 as set (``scaling.max_batch_per_device=16``), no probe;
* ``auto``: ``max_batch_per_device='auto'``, 3000 MiB per rank: the first trial (32) fits;
* ``auto_tight``: the same with rank 1 limited to 1030 MiB from start-up (a smaller device):
  a full search;
* ``auto_cached``: ``auto_tight`` again in the same work_dir: the stored result is read;
* ``microbatch_off`` / ``microbatch_on``: per-device 16 without and with
  ``on_oom='microbatch'`` (no out-of-memory error happens): iteration time and peak RSS.

For each: the finder's own time and trial count (from its log line), the time to the first
training iteration, the median iteration time and per-rank peak RSS. Writes
``bench/results/batch_finder.json``.

Usage: ``python bench/batch_finder.py [--epochs 3] [--reps 2] [--only VARIANT ...]``
"""
import argparse
import os.path as osp
import re
import tempfile

from common import ROOT, data_options, demo_data, iteration_times, save, spread, watch

CONFIG = osp.join(ROOT, 'configs', 'demo', 'td-hm_res18_1xb32-30e_demo-128x128.py')
LIMITED = "_base_ = [{base!r}]\ncustom_imports = dict(imports=['mmddp_ext', " \
          "'tests.helpers.limit_rank'], allow_failed_imports=False)\n"
FOUND = re.compile(r'batch probe: per-device batch (\d+) fits on every rank \((?:(\d+) trials, '
                   r'([\d.]+) s|measured before)')


def variants(data: str, epochs: int) -> dict:
    limited = osp.join(tempfile.mkdtemp(prefix='mmddp_finder_'), 'limited.py')
    with open(limited, 'w') as f:
        f.write(LIMITED.format(base=CONFIG))
    # training only: the last epoch's validation (batch 32, not probed) is skipped
    base = data_options(
        data, epochs) + ['scaling.global_batch_size=64', f'train_cfg.val_begin={epochs + 1}']
    auto = ['scaling.max_batch_per_device=auto', 'scaling.memory_budget_mib=3000']
    tight = dict(MMDDP_TEST_LIMIT='1:1030')
    return {
        'fixed': (CONFIG, base + ['scaling.max_batch_per_device=16'], None),
        'auto': (CONFIG, base + auto, None),
        'auto_tight': (limited, base + auto, tight),
        'auto_cached': (limited, base + auto, tight),  # reuses auto_tight's work_dir
        'microbatch_off': (CONFIG, base + ['scaling.max_batch_per_device=16'], None),
        'microbatch_on':
        (CONFIG, base + ['scaling.max_batch_per_device=16', 'scaling.on_oom=microbatch'], None),
    }


def run_once(name: str, spec: tuple, work: str) -> dict:
    config, options, env = spec
    r = watch(
        ['bash', 'tools/dist_train.sh', config, '2', '--work-dir', work, '--cfg-options', *options],
        env=env)
    log = r.pop('log')
    found = FOUND.search(log)
    plan = re.search(r'plan +(per-GPU batch .*)', log)
    times = iteration_times(work, skip=2)
    r.update(
        iter_time=spread(times), plan=plan[1] if plan else None, finder=None if not found else dict(
            max_batch=int(found[1]), trials=int(found[2]) if found[2] else 0,
            seconds=float(found[3]) if found[3] else 0.0))
    print(
        f'{name:15s} rc {r["rc"]} finder {r["finder"]} first iteration {r["first_iter_s"]} '
        f's, iteration {r["iter_time"]["median"]} s, peak RSS {r["peak_rss_mib"]}', flush=True)
    return r


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--epochs', type=int, default=3)
    parser.add_argument('--reps', type=int, default=2)
    parser.add_argument('--only', nargs='+', metavar='VARIANT',
                        help='run only these variants (results: batch_finder_<variants>.json)')
    args = parser.parse_args()
    data = demo_data(num_train=128)
    table = variants(data, args.epochs)
    unknown = sorted(set(args.only or ()) - set(table))
    if unknown:
        parser.error(f'unknown variant(s) {unknown}: choose from {sorted(table)}')
    table = {k: v for k, v in table.items() if not args.only or k in args.only}
    runs = {name: [] for name in table}
    for _ in range(args.reps):
        tight_work = tempfile.mkdtemp(prefix='mmddp_tight_')
        for name, spec in table.items():
            work = tight_work if name.startswith('auto_') else tempfile.mkdtemp(
                prefix=f'mmddp_{name}_')
            runs[name].append(run_once(name, spec, work))
    on = [r['iter_time']['median'] for r in runs.get('microbatch_on', [])]
    off = [r['iter_time']['median'] for r in runs.get('microbatch_off', [])]
    summary = dict(microbatch_iter_ratio=spread([a / b for a, b in zip(on, off) if a and b]))
    name = 'batch_finder' + ''.join(f'_{k}' for k in table if args.only)
    print(save(name, dict(runs=runs, summary=summary, epochs=args.epochs, reps=args.reps)))


if __name__ == '__main__':
    main()
