"""``RankMemoryHook``: every rank's memory, gathered, logged, written, plotted; stray contexts.

Every rank's iteration and data times ride along in the same gather, so a straggler is named
(:mod:`mmddp_ext.ddp.stragglers`) without a collective of its own.
"""
import json
import os
import os.path as osp
from typing import Dict, List, Optional

from mmengine.dist import all_gather_object
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS

from ..ddp.stragglers import (IterationClock, StragglerWatch, check_factor, check_patience,
                              plot_speed)
from ..gpu import physical, rank_device
from ..memory.nvml import NvmlProcessTableReader
from ..memory.stats import MemoryReader, MemorySample
from ..memory.stray import DeviceTable, GpuProcess, RankIdentity, find_stray
from ..utils.checks import positive_int
from ..utils.units import MIB, format_mib

SCALAR_KEYS = ('allocated', 'reserved', 'peak_allocated', 'device_used', 'rss', 'peak_rss')


def format_table(samples: List[Dict]) -> str:
    """The compact per-rank table rank 0 logs (MiB)."""

    def mib(v):
        return format_mib(v, unit='')

    cpu = all(s['device'] == 'cpu' for s in samples)
    head = (f'memory at iter {samples[0]["iter"]} (MiB), ' +
            ('CPU run: host RSS (peak RSS) per rank; no device memory' if cpu else
             'allocated / reserved / peak allocated | device used of total | host RSS (peak)'))
    rows = [head]
    for s in samples:
        dev = '' if cpu else (f'{mib(s["allocated"])} / {mib(s["reserved"])} / '
                              f'{mib(s["peak_allocated"])} | {mib(s["device_used"])} of '
                              f'{mib(s["device_total"])} | ')
        rows.append(f'  rank {s["rank"]} {s["host"]} pid {s["pid"]} {s["device"]}: {dev}'
                    f'RSS {mib(s["rss"])} ({mib(s["peak_rss"])})')
    return '\n'.join(rows)


@HOOKS.register_module()
class RankMemoryHook(Hook):
    """Per-rank memory: measured on every rank, gathered and logged on rank 0.

    Every ``interval`` iterations each rank measures allocated, reserved and peak-allocated
    CUDA memory, the device's used/total memory and its own host RSS (and peak RSS); on a CPU
    only the host numbers exist and the log says so. Rank 0 gathers them and logs one table;
    every rank appends its samples to ``<log_dir>/memory/rank{R}.jsonl``; rank 0 sends scalars
    ``memory/rank{R}/<key>_mib`` to the visualizer backends and writes
    ``<log_dir>/memory/memory.png`` (per-rank peak over iterations) when training ends.

    On GPUs with NVML, the process tables of the ranks' devices are gathered as well and
    :func:`~mmddp_ext.memory.stray.find_stray` names any rank holding memory on another rank's
    device and any process outside the job (each finding logged once).

    Each rank's median iteration, data and forward times over the interval
    (:class:`~mmddp_ext.ddp.stragglers.IterationClock`) ride along in the same sample and
    JSONL line (``iter_time_s``, ``data_time_s``, ``forward_time_s``); a rank whose data or
    forward time exceeds the others' by ``straggler_factor`` in ``straggler_patience`` samples
    in a row is named in a warning (:class:`~mmddp_ext.ddp.stragglers.StragglerWatch`), and
    ``speed.png`` beside ``memory.png`` plots every rank's iteration and data time.

    The hook never resets torch's peak counters, which MMEngine's ``memory`` log field relies
    on (MMEngine resets them whenever it logs); it folds the counter into its own running peak
    every iteration at NORMAL priority, before the LoggerHook (BELOW_NORMAL) reads and resets it.

    Collective: every rank must run it with the same interval (all ranks gather together).

    Args:
        interval: iterations between samples (positive int).
        stray_check: also gather NVML process tables on GPUs.
        plot: write the PNGs when training ends.
        straggler_factor: how many times the other ranks' median data or forward time a rank
            may take before it is named (a number above 1; None: no straggler check).
        straggler_patience: in how many samples in a row (positive int; with the default
            interval, 3 samples are 150 iterations).

    Example::

        default_hooks = dict(rank_memory=dict(interval=20))
    """

    priority = 'NORMAL'

    def __init__(self, interval: int = 50, stray_check: bool = True, plot: bool = True,
                 straggler_factor: Optional[float] = 1.5, straggler_patience: int = 3) -> None:
        self.interval = positive_int('RankMemoryHook interval', interval, 'a positive integer',
                                     ' (iterations between samples), e.g. interval=50')
        self.stray_check = stray_check
        self.plot = plot
        self.straggler_factor = check_factor(straggler_factor)
        self.straggler_patience = check_patience(straggler_patience)
        self._speed = (
            StragglerWatch(self.straggler_factor, self.straggler_patience)
            if self.straggler_factor else None)
        self.clock = IterationClock()
        self.reader: Optional[MemoryReader] = None
        self.baseline: Optional[MemorySample] = None
        self.last: Optional[MemorySample] = None
        self.history: List[List[Dict]] = []
        self.findings: List[str] = []
        self._reported = set()
        self._nvml = None

    def before_run(self, runner) -> None:
        """Pick the device and the output folder."""
        self.reader = MemoryReader(runner.rank, rank_device())
        self.out_dir = osp.join(runner.log_dir, 'memory')
        os.makedirs(self.out_dir, exist_ok=True)
        if self.stray_check and self.reader.is_cuda:
            self._nvml = NvmlProcessTableReader() if NvmlProcessTableReader.available() else None

    def before_train(self, runner) -> None:
        """Memory before the first step (model, optimizer wrapper, context): the baseline
        that the OOM advice subtracts to get the memory per sample."""
        self.baseline = self.reader.read(runner.iter)
        self.clock.attach(runner.model.module if is_model_wrapper(runner.model) else runner.model)

    def before_train_epoch(self, runner) -> None:
        """The next batch's wait counts from here."""
        self.clock.start()

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        """The batch arrived."""
        self.clock.batch_ready()

    def snapshot(self) -> Dict:
        """Baseline, last sample and a fresh one, for a failure record (no collectives)."""
        out = {'now': self.reader.read(self.last.iter if self.last else 0).to_dict()}
        if self.baseline is not None:
            out['baseline'] = self.baseline.to_dict()
        if self.last is not None:
            out['last'] = self.last.to_dict()
        return out

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        """Track the peak every iteration; sample, gather and log every ``interval``."""
        self.clock.iteration_done()
        self.reader.track_peak()
        if self.every_n_train_iters(runner, self.interval) or runner.iter == 0:
            self.sample(runner)

    def sample(self, runner) -> List[Dict]:
        """Measure, append to this rank's JSONL, gather; rank 0 logs. All ranks must call."""
        self.last = self.reader.read(runner.iter + 1)
        record = dict(self.last.to_dict(), **self.clock.take())
        with open(osp.join(self.out_dir, f'rank{runner.rank}.jsonl'), 'a') as f:
            f.write(json.dumps(record) + '\n')
        gathered = all_gather_object(record)
        if self._nvml is not None:
            self._check_stray(runner, gathered)
        if runner.rank == 0:
            self.history.append(gathered)
            runner.logger.info(format_table(gathered))
            self._check_speed(runner, gathered)
            scalars = {
                f'memory/rank{s["rank"]}/{k}_mib': s[k] / MIB
                for s in gathered
                for k in SCALAR_KEYS if s[k] is not None
            }
            runner.visualizer.add_scalars(scalars, step=runner.iter + 1)
        return gathered

    def _check_stray(self, runner, gathered: List[Dict]) -> None:
        index = physical(self.reader.index)
        table = self._nvml.read(index)
        tables = all_gather_object(
            dict(host=table.host, device_index=index, total_bytes=table.total_bytes,
                 processes=[(p.pid, p.used_bytes) for p in table.processes]))
        if runner.rank != 0:
            return
        ranks = [
            RankIdentity(s['rank'], s['host'], s['pid'], t['device_index'])
            for s, t in zip(gathered, tables)
        ]
        devs = [
            DeviceTable(t['host'], t['device_index'], t['total_bytes'],
                        tuple(GpuProcess(pid, used) for pid, used in t['processes']))
            for t in tables
        ]
        for finding in find_stray(ranks, devs):
            key = (finding.kind, finding.host, finding.device_index, finding.pid)
            if key not in self._reported:
                self._reported.add(key)
                self.findings.append(finding.message)
                runner.logger.warning(f'[mmddp_ext memory] {finding.message}')

    def _check_speed(self, runner, gathered: List[Dict]) -> None:
        found = self._speed.see(gathered) if self._speed is not None else None
        if found is not None:
            self.findings.append(found.message)
            runner.logger.warning(f'[mmddp_ext speed] {found.message}')

    def after_run(self, runner) -> None:
        """Rank 0 writes the per-rank peak plot and the iteration time plot."""
        self.clock.detach()
        if self._nvml is not None:
            self._nvml.close()
        if runner.rank == 0 and self.plot and self.history:
            path = plot_history(self.history, osp.join(self.out_dir, 'memory.png'))
            speed = plot_speed(self.history, osp.join(self.out_dir, 'speed.png'))
            runner.logger.info(f'[mmddp_ext] per-rank memory plot: {path}' +
                               (f'; iteration time plot: {speed}' if speed else ''))


def plot_history(history: List[List[Dict]], path: str) -> str:
    """Per-rank peak (peak allocated on GPUs, peak RSS on CPUs) over iterations, as a PNG."""
    import matplotlib  # here: a plot is drawn once a run, and matplotlib is slow to import
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    cpu = history[0][0]['device'] == 'cpu'
    key, label = ('peak_rss', 'peak host RSS') if cpu else ('peak_allocated', 'peak allocated')
    fig, ax = plt.subplots(figsize=(7, 4))
    for rank in sorted({s['rank'] for samples in history for s in samples}):
        points = [(s['iter'], s[key] / MIB) for samples in history for s in samples
                  if s['rank'] == rank and s[key] is not None]
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker='o', label=f'rank {rank}')
    ax.set_xlabel('iteration')
    ax.set_ylabel(f'{label} (MiB)')
    ax.set_title(f'mmddp_ext: {label} per rank' + (' (CPU run)' if cpu else ''))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
