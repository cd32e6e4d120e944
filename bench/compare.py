"""mmddp_ext vs stock MMEngine, side by side in one run (interleaved repetitions).

    python bench/compare.py [--reps 3] [--epochs 3] [--images 256]

writes bench/results/compare.json.

Variants (the demo config, 2 CPU processes where "ddp", per-device batch 32 everywhere):

* ``single_stock``  1 process, MMPose's own ``tools/train.py`` (stock Runner);
* ``single_ours``   1 process, ``tools/dist_train.py`` (DDPRunner, RankMemoryHook every 50);
* ``ddp_stock``     ``dist_train.sh ... 2`` with ``runner_type=Runner`` and MMEngine's DDP
  defaults (``gradient_as_bucket_view=False``): what a stock run does once it can start on a CPU;
* ``ddp_ours``      ``dist_train.sh ... 2``, DDPRunner defaults (bucket view, RankMemoryHook/50);
* ``ddp_ours_mem1`` the same with ``RankMemoryHook(interval=1)``;
* launch: time to the first training iteration of ``dist_train.sh`` vs plain
  ``torchrun --standalone`` running ``tools/dist_train.py``, and plain torchrun running
  MMPose's ``tools/train.py --launcher pytorch`` (stock; on a CPU it cannot start).

Reported: per-rank peak RSS (polled), median iteration time (MMEngine's logged ``time``, first
3 iterations dropped), samples/s, time to the first iteration; ratios against the stock
variant measured in the same repetition, with their spread over repetitions.
"""
import argparse
import os.path as osp
import statistics
import tempfile

from common import DEMO, PYTHON, data_options, demo_data, iteration_times, save, spread, watch


def _mmpose_train() -> str:
    import mmpose
    return osp.join(osp.dirname(mmpose.__file__), '.mim', 'tools', 'train.py')


def _mem1_config() -> str:
    path = osp.join(tempfile.mkdtemp(prefix='mmddp_bench_'), 'demo_mem1.py')
    with open(path, 'w') as f:
        f.write(f"_base_ = [{DEMO!r}]\ncustom_hooks = [dict(type='SyncBuffersHook'), "
                "dict(type='RankMemoryHook', interval=1)]\n")
    return path


def variants(data: str, epochs: int) -> dict:
    """name -> (command builder(work_dir), global batch)."""
    opts = data_options(data, epochs)
    sh = ['bash', 'tools/dist_train.sh']
    mem1 = _mem1_config()
    return {
        'single_stock':
        (lambda w: [PYTHON, _mmpose_train(), DEMO, '--work-dir', w, '--cfg-options', *opts], 32),
        'single_ours': (lambda w: [
            PYTHON, 'tools/dist_train.py', DEMO, '--work-dir', w, '--cfg-options', *opts,
            'scaling.global_batch_size=32'
        ], 32),
        'ddp_stock': (lambda w: [
            *sh, DEMO, '2', '--work-dir', w, '--cfg-options', *opts, 'runner_type=Runner',
            'model_wrapper_cfg.gradient_as_bucket_view=False'
        ], 64),
        'ddp_ours':
        (lambda w:
         [*sh, DEMO, '2', '--work-dir', w, '--cfg-options', *opts, 'scaling.global_batch_size=64'],
         64),
        'ddp_ours_mem1':
        (lambda w:
         [*sh, mem1, '2', '--work-dir', w, '--cfg-options', *opts, 'scaling.global_batch_size=64'],
         64),
    }


def launch_variants(data: str) -> dict:
    """name -> command builder(work_dir) for the time to the first iteration."""
    opts = data_options(data, 1)
    torchrun = [PYTHON, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2']
    return {
        'dist_train.sh':
        lambda w:
        ['bash', 'tools/dist_train.sh', DEMO, '2', '--work-dir', w, '--cfg-options', *opts],
        'torchrun+dist_train.py':
        lambda w: [*torchrun, 'tools/dist_train.py', DEMO, '--work-dir', w, '--cfg-options', *opts],
        'torchrun+mmpose_train.py':
        lambda w: [
            *torchrun,
            _mmpose_train(), DEMO, '--launcher', 'pytorch', '--work-dir', w, '--cfg-options', *opts
        ],
    }


def run_training(args, data: str) -> dict:
    table = variants(data, args.epochs)
    runs = {name: [] for name in table}
    for rep in range(args.reps):
        for name, (build, global_batch) in table.items():
            work = tempfile.mkdtemp(prefix=f'mmddp_{name}_')
            r = watch(build(work))
            r.pop('log')
            times = iteration_times(work)
            r.update(
                iter_time=spread(times), global_batch=global_batch,
                samples_per_s=round(global_batch / statistics.median(times), 2) if times else None)
            runs[name].append(r)
            print(
                f'rep {rep + 1}/{args.reps} {name:14s} rc {r["rc"]} '
                f'iter {r["iter_time"]["median"]} s, peak RSS {r["peak_rss_mib"]}', flush=True)
    return runs


def run_launch(args, data: str) -> dict:
    table = launch_variants(data)
    runs = {name: [] for name in table}
    for rep in range(args.reps):
        for name, build in table.items():
            r = watch(build(tempfile.mkdtemp(prefix='mmddp_launch_')), timeout=300)
            r.pop('log')
            runs[name].append(r)
            print(
                f'rep {rep + 1}/{args.reps} {name:26s} rc {r["rc"]} first iteration after '
                f'{r["first_iter_s"]} s', flush=True)
    return runs


def _ratio(runs, a, b, key):
    """Per-repetition ratio a/b of ``key(run)``, as a spread."""
    vals = [key(x) / key(y) for x, y in zip(runs[a], runs[b]) if key(x) is not None and key(y)]
    return spread(vals)


def _peak(r):
    return max(r['peak_rss_mib'].values()) if r['peak_rss_mib'] and r['rc'] == 0 else None


def _iter(r):
    return r['iter_time']['median'] if r['rc'] == 0 else None


def report(train: dict, launch: dict) -> dict:
    """The ratios the targets are about, printed as a table."""
    out = {
        'a_peak_ddp_stock_vs_single':
        _ratio(train, 'ddp_stock', 'single_stock', _peak),
        'a_peak_ddp_ours_vs_single':
        _ratio(train, 'ddp_ours', 'single_stock', _peak),
        'b_iter_mem1_vs_stock':
        _ratio(train, 'ddp_ours_mem1', 'ddp_stock', _iter),
        'b_iter_default_vs_stock':
        _ratio(train, 'ddp_ours', 'ddp_stock', _iter),
        'b_iter_mem1_vs_default':
        _ratio(train, 'ddp_ours_mem1', 'ddp_ours', _iter),
        'c_first_iter_sh_vs_torchrun':
        _ratio(launch, 'dist_train.sh', 'torchrun+dist_train.py', lambda r: r['first_iter_s']),
        'd_samples_per_s': {
            k: spread([r['samples_per_s'] for r in v if r['samples_per_s']])
            for k, v in train.items()
        },
        'peak_rss_mib': {
            k: spread([_peak(r) for r in v if _peak(r)])
            for k, v in train.items()
        },
        'first_iter_s': {
            k: spread([r['first_iter_s'] for r in v if r['first_iter_s']])
            for k, v in launch.items()
        },
        'stock_torchrun_rc': [r['rc'] for r in launch.get('torchrun+mmpose_train.py', [])],
    }
    for key, value in out.items():
        print(f'{key:32s} {value}')
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--reps', type=int, default=3)
    p.add_argument('--epochs', type=int, default=3)
    p.add_argument('--images', type=int, default=256)
    p.add_argument('--only', choices=['train', 'launch'], default=None)
    args = p.parse_args()
    data = demo_data(args.images)
    train = run_training(args, data) if args.only != 'launch' else {}
    launch = run_launch(args, data) if args.only != 'train' else {}
    summary = report(train, launch) if train and launch else {}
    print('wrote',
          save('compare', dict(args=vars(args), summary=summary, train=train, launch=launch)))


if __name__ == '__main__':
    main()
