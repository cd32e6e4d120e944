"""Shared helpers of the benchmarks: run a training command, watch it, read what it logged.

``watch`` streams a command's output, timestamps the first training iteration, and polls the
peak RSS of every process in its tree (per rank, from each process's ``RANK``), so stock
MMEngine runs — which log nothing of their own — are measured the same way as ours.
"""
import glob
import json
import os
import os.path as osp
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional

import psutil

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEMO = osp.join(ROOT, 'configs', 'demo', 'td-hm_res18_1xb32-30e_demo-64x64.py')
PYTHON = sys.executable
FIRST_ITER = 'Epoch(train)'


def demo_data(num_train: int = 128) -> str:
    """A fresh small demo dataset in a temporary folder."""
    sys.path.insert(0, ROOT)
    from mmddp_ext.demo import make_demo_dataset
    out = osp.join(tempfile.mkdtemp(prefix='mmddp_bench_'), 'data')
    make_demo_dataset(out, num_train=num_train, num_val=8, size=96)
    return out


def data_options(root: str, epochs: int) -> List[str]:
    """``--cfg-options`` pointing the demo at ``root``: no validation, log every iteration."""
    root = root.rstrip('/') + '/'
    return [
        f'train_dataloader.dataset.data_root={root}', f'val_dataloader.dataset.data_root={root}',
        f'val_evaluator.ann_file={root}annotations/val.json', f'train_cfg.max_epochs={epochs}',
        'train_cfg.val_interval=1000', 'default_hooks.logger.interval=1',
        'default_hooks.checkpoint.interval=1000', 'train_dataloader.num_workers=0',
        'train_dataloader.persistent_workers=False'
    ]


def _poll(root_pid: int, peaks: Dict[str, float], stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            procs = [psutil.Process(root_pid)] + psutil.Process(root_pid).children(True)
        except psutil.Error:
            return
        for p in procs:
            try:
                # ranks carry RANK; a single-process run is the root process itself
                rank = p.environ().get('RANK') or ('single' if p.pid == root_pid else None)
                if rank is not None and 'python' in p.name():
                    rss = p.memory_info().rss / 2**20
                    peaks[rank] = max(peaks.get(rank, 0.0), rss)
            except psutil.Error:
                continue
        time.sleep(0.1)


def watch(cmd: List[str], timeout: float = 900, env: Optional[dict] = None) -> dict:
    """Run ``cmd`` in the repository root; return rc, seconds, time to the first training
    iteration, per-rank peak RSS (MiB, polled), on failure the first exception line, and the
    whole output under ``log`` (pop it before saving)."""
    full = dict(os.environ, OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1',
                PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
    full.update(env or {})
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=full, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    peaks: Dict[str, float] = {}
    stop = threading.Event()
    poller = threading.Thread(target=_poll, args=(proc.pid, peaks, stop), daemon=True)
    poller.start()
    first, lines = None, []
    for line in proc.stdout:
        lines.append(line)
        if first is None and FIRST_ITER in line:
            first = time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            proc.kill()
    proc.wait()
    stop.set()
    poller.join()
    errors = [ln.strip() for ln in lines if ln[:1].isalpha() and 'Error:' in ln]
    return dict(rc=proc.returncode, seconds=round(time.monotonic() - t0, 2),
                first_iter_s=None if first is None else round(first, 2), peak_rss_mib={
                    k: round(v, 1)
                    for k, v in sorted(peaks.items())
                }, error=errors[0][:300] if proc.returncode and errors else None,
                log=''.join(lines))


def iteration_times(work_dir: str, skip: int = 3) -> List[float]:
    """Per-iteration ``time`` values MMEngine logged (first ``skip`` dropped: warm-up)."""
    found = glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json'))
    if not found:
        return []
    rows = [json.loads(x) for x in open(found[0])]
    return [r['time'] for r in rows if 'time' in r and 'loss' in r][skip:]


def spread(values: List[float]) -> dict:
    """Median and min-max of a list (None when empty)."""
    if not values:
        return dict(median=None, min=None, max=None, n=0)
    return dict(
        median=round(statistics.median(values), 4), min=round(min(values), 4),
        max=round(max(values), 4), n=len(values))


def save(name: str, data: dict) -> str:
    """Write ``bench/results/<name>.json``; returns the path."""
    os.makedirs(osp.join(ROOT, 'bench', 'results'), exist_ok=True)
    path = osp.join(ROOT, 'bench', 'results', f'{name}.json')
    with open(path, 'w') as f:
        json.dump(dict(data, cores=os.cpu_count(), python=sys.version.split()[0]), f, indent=1)
    return path
