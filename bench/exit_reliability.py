"""How often does a short 2-process CPU (gloo) DDP run fail at exit?

Runs ``bash tools/dist_train.sh <demo> 2`` N times back to back on a small demo dataset and
counts non-zero exits, and among them gloo's exit abort (``terminate called without an active
exception``). Prints a table and writes ``bench/results/exit_reliability.json``.

    python bench/exit_reliability.py [--runs 30] [--nproc 2]
"""
import argparse
import os
import os.path as osp
import subprocess
import tempfile
import time

from common import DEMO, ROOT, data_options, demo_data, save

ABORT = 'terminate called without an active exception'


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--runs', type=int, default=30)
    p.add_argument('--nproc', type=int, default=2)
    args = p.parse_args()
    data = demo_data(32)
    tmp = tempfile.mkdtemp(prefix='mmddp_exit_')
    results = []
    for i in range(args.runs):
        t0 = time.monotonic()
        proc = subprocess.run([
            'bash', 'tools/dist_train.sh', DEMO,
            str(args.nproc), '--work-dir',
            osp.join(tmp, f'run{i}'), '--cfg-options', *data_options(data, 1)
        ], cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env=dict(os.environ, OMP_NUM_THREADS='1'))
        results.append(
            dict(run=i, rc=proc.returncode, abort=ABORT in proc.stdout,
                 seconds=round(time.monotonic() - t0, 1)))
        print(
            f'run {i + 1:2d}/{args.runs}: exit {proc.returncode}'
            f'{" (gloo abort at exit)" if results[-1]["abort"] else ""} '
            f'in {results[-1]["seconds"]} s', flush=True)
    failed = [r for r in results if r['rc'] != 0]
    summary = dict(runs=args.runs, nproc=args.nproc, failed=len(failed),
                   gloo_aborts=sum(r['abort'] for r in results), results=results)
    print(f'\n{len(failed)} of {args.runs} runs failed; {summary["gloo_aborts"]} gloo aborts '
          'at exit')
    save('exit_reliability', summary)


if __name__ == '__main__':
    main()
