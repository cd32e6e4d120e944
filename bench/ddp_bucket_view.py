"""Per-rank peak RSS of CPU (gloo) DDP training with and without ``gradient_as_bucket_view``.

By default DDP keeps its gradient buckets as a second copy of the gradients;
``gradient_as_bucket_view=True`` makes ``param.grad`` a view into the buckets, which should
save about the gradients' size per rank. This trains torchvision's ResNet-50 (no weights,
SGD with momentum, random data, one thread per process) in three variants, run
interleaved ``--reps`` times as subprocesses:

* ``single`` -- one plain process, no DDP (the baseline);
* ``off``    -- 2-process DDP (torchrun, gloo), ``gradient_as_bucket_view=False``;
* ``on``     -- the same with ``gradient_as_bucket_view=True`` (mmddp_ext's default).

    python bench/ddp_bucket_view.py [--reps 3] [--steps 5] [--batch 8] [--size 128]

Reading the result: the table gives each variant's per-rank peak RSS (``ru_maxrss``) as the
median over all reps and ranks, with the min-max spread. ``off - on`` is the measured saving;
compare it with the gradients' size. Raw numbers go to ``bench/results/ddp_bucket_view.json``.
Peak RSS also reflects glibc's malloc keeping freed memory; ``MALLOC_MMAP_THRESHOLD_=131072``
in the environment makes freed big blocks go back to the OS, so it measures the live peak.
"""
import argparse
import json
import os
import os.path as osp
import statistics
import subprocess
import sys
import time

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
OUT = osp.join(ROOT, 'bench', 'results', 'ddp_bucket_view.json')
VARIANTS = ('single', 'off', 'on')
MIB = 1024 * 1024


def rss_now_mib() -> float:
    """Current resident set size of this process in MiB (from /proc/self/statm)."""
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / MIB


def worker(args: argparse.Namespace) -> None:
    """Train ResNet-50 for ``args.steps`` steps and print one ``RESULT {json}`` line."""
    import gc
    import resource

    import torch
    import torch.distributed as dist
    import torchvision

    torch.set_num_threads(1)
    ddp = not args.single
    if ddp:
        dist.init_process_group('gloo')
    rank = dist.get_rank() if ddp else 0
    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None)
    grad_mib = sum(p.numel() * p.element_size() for p in model.parameters()) / MIB
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=None, broadcast_buffers=False,
            gradient_as_bucket_view=bool(args.bucket_view))
    rss_model = rss_now_mib()
    optim = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    torch.manual_seed(1 + rank)
    t0 = time.monotonic()
    for _ in range(args.steps):
        x = torch.randn(args.batch, 3, args.size, args.size)
        y = torch.randint(0, 1000, (args.batch, ))
        optim.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optim.step()
    seconds = time.monotonic() - t0
    params = [p for p in model.parameters() if p.grad is not None]
    views = sum(p.grad._base is not None for p in params) / max(len(params), 1)
    result = dict(rank=rank, peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  rss_after_model_mib=rss_model, rss_end_mib=rss_now_mib(), grad_mib=grad_mib,
                  grads_are_views=views, train_seconds=round(seconds, 2))
    print('RESULT ' + json.dumps(result), flush=True)
    if ddp:
        dist.barrier()
        dist.destroy_process_group()
    del model, optim, params
    gc.collect()


def launch(variant: str, args: argparse.Namespace, timeout: float) -> dict:
    """Run one variant as a subprocess; return its per-rank results or the failure."""
    common = ['--steps', str(args.steps), '--batch', str(args.batch), '--size', str(args.size)]
    me = osp.abspath(__file__)
    if variant == 'single':
        cmd = [sys.executable, me, '--worker', '--single', *common]
        nranks = 1
    else:
        cmd = [
            sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', me,
            '--worker', '--bucket-view', '1' if variant == 'on' else '0', *common
        ]
        nranks = 2
    t0 = time.monotonic()
    env = dict(os.environ, OMP_NUM_THREADS='1')
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, text=True, timeout=timeout,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        rc, out = proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or '')
        rc = 'timeout'
    ranks = sorted((json.loads(line.split('RESULT ', 1)[1])
                    for line in out.splitlines() if 'RESULT {' in line), key=lambda r: r['rank'])
    ok = rc == 0 and len(ranks) == nranks
    run = dict(variant=variant, rc=rc, ok=ok, seconds=round(time.monotonic() - t0, 1), ranks=ranks)
    if not ok:
        run['output_tail'] = out[-3000:]
    return run


def summarize(runs: list) -> dict:
    """Median and spread of per-rank peak RSS for each variant (successful runs only)."""
    summary = {}
    for v in VARIANTS:
        peaks = [
            r['peak_rss_mib'] for run in runs if run['variant'] == v and run['ok']
            for r in run['ranks']
        ]
        ends = [
            r['rss_end_mib'] for run in runs if run['variant'] == v and run['ok']
            for r in run['ranks']
        ]
        if peaks:
            summary[v] = dict(
                n=len(peaks), peak_median_mib=round(statistics.median(peaks), 1),
                peak_min_mib=round(min(peaks), 1), peak_max_mib=round(max(peaks), 1),
                end_rss_median_mib=round(statistics.median(ends), 1))
    return summary


def driver(args: argparse.Namespace) -> None:
    """Run the variants interleaved, print the table and write the JSON."""
    import torch
    t0 = time.monotonic()
    runs = []
    for rep in range(args.reps):
        for v in VARIANTS:
            run = launch(v, args, args.timeout)
            runs.append(dict(rep=rep, **run))
            peaks = ', '.join(f"{r['peak_rss_mib']:.0f}" for r in run['ranks'])
            status = 'ok' if run['ok'] else f"FAILED (rc={run['rc']})"
            print(
                f"rep {rep + 1}/{args.reps} {v:6s}: {status} in {run['seconds']} s; "
                f"peak RSS per rank [MiB]: {peaks or '-'}", flush=True)
    summary = summarize(runs)
    grad = next((r['grad_mib'] for run in runs if run['ok'] for r in run['ranks']), float('nan'))
    print(f"\n{'variant':8s} {'n':>3s} {'peak RSS median':>16s} {'min-max':>15s} {'end RSS':>9s}")
    for v, s in summary.items():
        print(f"{v:8s} {s['n']:3d} {s['peak_median_mib']:12.1f} MiB "
              f"{s['peak_min_mib']:7.0f}-{s['peak_max_mib']:<7.0f} {s['end_rss_median_mib']:9.1f}")
    med = {v: s['peak_median_mib'] for v, s in summary.items()}
    if len(med) == 3:
        print(f"\noff/single = {med['off'] / med['single']:.3f}   on/single = "
              f"{med['on'] / med['single']:.3f}")
        print(f"saving off - on = {med['off'] - med['on']:.1f} MiB   "
              f"(gradients' size = {grad:.1f} MiB)")
    failed = [r for r in runs if not r['ok']]
    if failed:
        print(f'\n{len(failed)} run(s) failed; see output_tail in {osp.relpath(OUT, ROOT)}')
    os.makedirs(osp.dirname(OUT), exist_ok=True)
    doc = dict(
        command=' '.join([osp.relpath(sys.argv[0], ROOT), *sys.argv[1:]]), torch=torch.__version__,
        cores=os.cpu_count(), args=vars(args), grad_mib=grad, medians=summary,
        saving_off_minus_on_mib=(round(med['off'] - med['on'], 1) if len(med) == 3 else None),
        total_seconds=round(time.monotonic() - t0, 1), runs=runs)
    with open(OUT, 'w') as f:
        json.dump(doc, f, indent=1)
    print(f"\nwrote {osp.relpath(OUT, ROOT)} in {doc['total_seconds']} s total")


def main() -> None:
    """Parse arguments and dispatch to worker or driver mode."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--reps', type=int, default=3)
    p.add_argument('--steps', type=int, default=5)
    p.add_argument('--batch', type=int, default=8)
    p.add_argument('--size', type=int, default=128)
    p.add_argument('--timeout', type=float, default=600, help='seconds per subprocess')
    p.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
    p.add_argument('--single', action='store_true', help=argparse.SUPPRESS)
    p.add_argument('--bucket-view', type=int, choices=(0, 1), default=1, help=argparse.SUPPRESS)
    args = p.parse_args()
    worker(args) if args.worker else driver(args)


if __name__ == '__main__':
    main()
