"""How often does a short 2-process CPU (gloo) DDP run fail at exit?

Runs ``bash tools/dist_train.sh <demo> 2`` N times back to back on a small demo dataset and
counts non-zero exits, and among them gloo's exit abort (``terminate called without an active
exception``). Prints a table and writes ``bench/results/exit_reliability.json``.

    python bench/exit_reliability.py [--runs 30] [--nproc 2]
"""
import argparse
import json
import os
import os.path as osp
import subprocess
import sys
import tempfile
import time

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, ROOT)
DEMO = osp.join(ROOT, 'configs', 'demo', 'td-hm_res18_1xb32-30e_demo-64x64.py')
ABORT = 'terminate called without an active exception'


def short_run_args(data: str) -> list:
    root = data.rstrip('/') + '/'
    opts = [f'train_dataloader.dataset.data_root={root}', f'val_dataloader.dataset.data_root={root}',
            f'test_dataloader.dataset.data_root={root}',
            f'val_evaluator.ann_file={root}annotations/val.json',
            'train_cfg.max_epochs=1', 'train_cfg.val_interval=10',
            'train_dataloader.num_workers=0', 'train_dataloader.persistent_workers=False',
            'val_dataloader.num_workers=0', 'val_dataloader.persistent_workers=False',
            'default_hooks.checkpoint.interval=10']
    return ['--cfg-options', *opts]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--runs', type=int, default=30)
    p.add_argument('--nproc', type=int, default=2)
    args = p.parse_args()
    from mmddp_ext.demo_data import make_demo_dataset
    tmp = tempfile.mkdtemp(prefix='mmddp_exit_')
    make_demo_dataset(osp.join(tmp, 'data'), num_train=32, num_val=8, size=96)
    results = []
    for i in range(args.runs):
        t0 = time.monotonic()
        proc = subprocess.run(
            ['bash', 'tools/dist_train.sh', DEMO, str(args.nproc), '--work-dir',
             osp.join(tmp, f'run{i}'), *short_run_args(osp.join(tmp, 'data'))],
            cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env=dict(os.environ, OMP_NUM_THREADS='1'))
        results.append(dict(run=i, rc=proc.returncode, abort=ABORT in proc.stdout,
                            seconds=round(time.monotonic() - t0, 1)))
        print(f'run {i + 1:2d}/{args.runs}: exit {proc.returncode}'
              f'{" (gloo abort at exit)" if results[-1]["abort"] else ""} '
              f'in {results[-1]["seconds"]} s', flush=True)
    failed = [r for r in results if r['rc'] != 0]
    summary = dict(runs=args.runs, nproc=args.nproc, failed=len(failed),
                   gloo_aborts=sum(r['abort'] for r in results), results=results)
    print(f'\n{len(failed)} of {args.runs} runs failed; {summary["gloo_aborts"]} gloo aborts '
          'at exit')
    os.makedirs(osp.join(ROOT, 'bench', 'results'), exist_ok=True)
    with open(osp.join(ROOT, 'bench', 'results', 'exit_reliability.json'), 'w') as f:
        json.dump(summary, f, indent=1)


if __name__ == '__main__':
    main()
