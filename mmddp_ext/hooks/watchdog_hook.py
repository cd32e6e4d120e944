"""``HangWatchdogHook``: a rank that stops making progress dumps every thread's stack and stops,
well before MMEngine's 30-minute collective timeout, with nothing set up in advance."""
import contextlib
import faulthandler
import os
import signal
import socket
import threading
import time
from collections import deque
from typing import Any, Deque, Dict, Optional, Sequence

import psutil
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from ..diagnose.records import ProgressFile, begin_progress, stacks_path
from ..gpu import gpus
from ..node.facts import memory_cgroup, oom_kills
from ..utils.checks import positive_number
from ..utils.ticker import Ticker

FIRST_METRIC_BOUND = 3600.0  # seconds for the metrics before one computation has been timed
METRIC_GRACE = 60.0  # the waiting ranks' bound is this much later than rank 0's


def watchdog_bound(iter_seconds: Sequence[float], timeout: Optional[float], factor: float,
                   min_timeout: float) -> Optional[float]:
    """Seconds without progress after which a rank counts as stuck, during training iterations.

    ``timeout`` when given; else ``max(min_timeout, factor × slowest recent iteration)``; None
    before an iteration has been timed (the start-up bound applies then).

    Example: iterations of 0.6 s, factor 10, min 120 s -> 120 s; iterations of 30 s -> 300 s.
    """
    if timeout is not None:
        return float(timeout)
    if not iter_seconds:
        return None
    return max(float(min_timeout), factor * max(iter_seconds))


def metric_bound(metric_seconds: Sequence[float], metric_timeout: Optional[float], factor: float,
                 slow_timeout: float) -> float:
    """Seconds rank 0 may spend computing the metrics after the last validation (or test) batch.

    ``metric_timeout`` when given; else ``max(slow_timeout, factor × longest computation so far)``,
    or ``max(slow_timeout, 3600 s)`` before one has been timed.

    Example: no computation timed yet -> 3600 s; a 40 s computation, factor 10, slow 600 s ->
    600 s; a 5-minute one -> 3000 s.
    """
    if metric_timeout is not None:
        return float(metric_timeout)
    if not metric_seconds:
        return max(float(slow_timeout), FIRST_METRIC_BOUND)
    return max(float(slow_timeout), factor * max(metric_seconds))


def _positive(name: str, value: Any, allow_none: bool = False) -> None:
    """ValueError unless ``value`` is a number above 0 (or None, when ``allow_none``)."""
    if value is None and allow_none:
        return
    unit = 'iterations' if name == 'window' else 'seconds'
    positive_number(f'HangWatchdogHook {name}', value, f'a positive number of {unit}',
                    ' or None (automatic)' if allow_none else '', finite=False)


@HOOKS.register_module()
class HangWatchdogHook(Hook):
    """Names a stuck rank: progress files, a stack dump on a hang, and a bounded wait.

    Every rank writes ``<work_dir>/ranks/rank{R}.json`` after each training iteration (last
    completed iteration, slowest recent iteration time, host RSS, device memory) and arms
    :func:`faulthandler.dump_traceback_later`. When no iteration completes within the bound,
    the interpreter itself writes every thread's stack to ``ranks/rank{R}.stacks.txt`` and
    exits the rank (exit code 1); torchrun then stops the others, which dump their stacks on
    its SIGTERM. ``python -m mmddp_ext.diagnose`` reads both and names the rank that did not
    reach the collective, the line it was on, and the ranks that waited for it. This works
    while the main thread is blocked inside C++ (gloo, NCCL, CUDA) and needs no environment
    variables set in advance.

    The bound during training is ``timeout`` if given, else
    ``max(min_timeout, factor × slowest of the last `window` iterations)``. Before the first
    iteration is timed, and around validation, evaluation and checkpoint saving, the
    ``slow_timeout`` applies (whichever is larger). Defaults: 120 s minimum, 10× the slowest
    iteration, 600 s for the slow phases: a hang is named in minutes instead of MMEngine's
    30-minute collective timeout.

    After the last validation (or test) batch rank 0 computes the metrics while the others wait
    (:class:`~mmddp_ext.runner.evaluation.PatientEvaluator`, not the collective timeout, bounds that
    wait): rank 0's bound is then :func:`metric_bound` (``metric_timeout``, else 10× the longest
    computation so far, at least ``slow_timeout``; 3600 s for the first), the waiting ranks'
    60 s later; every ``report_every`` seconds rank 0 logs how long it has computed and how
    busy its CPU was.

    A collective timeout of your own shorter than the bound (``env_cfg.dist_cfg.timeout``) ends
    the waiting rank first; the diagnosis still names the rank that did not arrive, from the
    stack it dumped when torchrun stopped it.

    Args:
        timeout: fixed bound in seconds during training iterations (None: automatic).
        factor: multiple of the slowest recent iteration time (automatic bound).
        min_timeout: lower limit of the automatic bound, seconds.
        slow_timeout: bound before the first iteration and around validation, evaluation and
            checkpoint saving, seconds.
        window: how many recent iterations the automatic bound looks at.
        metric_timeout: fixed bound in seconds on rank 0's metric computation (None: automatic).
        report_every: seconds between rank 0's progress lines while it computes the metrics.
        enabled: False turns the watchdog off; the progress files are still written, since
            the diagnosis reads them after any failure, not only a hang.

    Example::

        default_hooks = dict(hang_watchdog=dict(min_timeout=300))
    """

    priority = 'VERY_HIGH'

    def __init__(self, timeout: Optional[float] = None, factor: float = 10.0,
                 min_timeout: float = 120.0, slow_timeout: float = 600.0, window: int = 20,
                 enabled: bool = True, metric_timeout: Optional[float] = None,
                 report_every: float = 60.0) -> None:
        _positive('timeout', timeout, allow_none=True)
        _positive('metric_timeout', metric_timeout, allow_none=True)
        for name, value in (('factor', factor), ('min_timeout', min_timeout),
                            ('slow_timeout', slow_timeout), ('window', window), ('report_every',
                                                                                 report_every)):
            _positive(name, value)
        self.timeout, self.factor, self.min_timeout = timeout, factor, min_timeout
        self.slow_timeout, self.enabled = slow_timeout, enabled
        self.metric_timeout, self.report_every = metric_timeout, report_every
        self.metric_seconds: Deque[float] = deque(maxlen=int(window))
        self._metric_start: Optional[float] = None
        self._ticker: Optional[Ticker] = None
        self.iter_seconds: Deque[float] = deque(maxlen=int(window))
        self.state: Dict[str, Any] = {}
        self._stack_file = None
        self._progress: Optional[ProgressFile] = None
        self._last_tick: Optional[float] = None
        self._announced = False
        self._was_enabled = False
        self._process = None  # psutil.Process of this rank, made once

    # ---- set-up and tear-down ----
    def before_run(self, runner) -> None:
        rank = runner.rank
        self._progress = ProgressFile(begin_progress(runner.work_dir, rank), runner.work_dir)
        self.state = dict(rank=rank, world_size=runner.world_size, run=runner.timestamp,
                          pid=os.getpid(), host=socket.gethostname(),
                          slurm_node=os.environ.get('SLURMD_NODENAME'),
                          main_thread=threading.main_thread().ident, phase='start',
                          completed_iter=None, slowest_iter_s=None, bound_s=None, time=None,
                          rss=None, device_allocated=None, memory_cgroup=memory_cgroup())
        self.state['oom_kills_at_start'] = oom_kills(self.state['memory_cgroup'])
        self._stack_file = open(stacks_path(runner.work_dir, rank), 'w')
        self._was_enabled = faulthandler.is_enabled()
        # fatal signals (SIGSEGV, SIGABRT, SIGBUS, SIGFPE) and the launcher's stop signal:
        # dump every thread, then die as before
        faulthandler.enable(file=self._stack_file, all_threads=True)
        if hasattr(signal, 'SIGTERM'):
            faulthandler.register(signal.SIGTERM, file=self._stack_file, all_threads=True,
                                  chain=True)
        self._write()

    def after_run(self, runner) -> None:
        self._stop_ticker()
        faulthandler.cancel_dump_traceback_later()
        if self._stack_file is None:
            return
        if hasattr(signal, 'SIGTERM'):
            faulthandler.unregister(signal.SIGTERM)
        faulthandler.disable()
        if self._was_enabled:  # as it was (e.g. PYTHONFAULTHANDLER=1): to stderr
            try:
                faulthandler.enable()
            except (RuntimeError, ValueError, OSError):  # stderr without a file descriptor
                pass
        path = self._stack_file.name
        self._stack_file.close()
        self._stack_file = None
        if os.path.getsize(path) == 0:
            with contextlib.suppress(OSError):  # a work dir that refuses keeps it: no harm
                os.remove(path)
        self._phase('done')
        self._progress.close()
        self._progress = None

    # ---- training ----
    def before_train(self, runner) -> None:
        if self.enabled:
            runner.logger.info(
                '[mmddp_ext] hang watchdog: a rank without progress for ' +
                (f'{self.timeout:g} s' if self.timeout is not None else
                 f'max({self.min_timeout:g} s, {self.factor:g} × slowest iteration)') +
                f' ({self.slow_timeout:g} s before the first iteration and around validation '
                'and checkpoints; for rank 0\'s metrics ' +
                (f'{self.metric_timeout:g} s' if self.
                 metric_timeout is not None else '1 h, then 10 × the longest computation') +
                ') dumps its stacks to ranks/ and stops; python -m mmddp_ext.diagnose names it')
        self._phase('train', slow=True)

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        now = time.monotonic()
        if self._last_tick is not None:
            self.iter_seconds.append(now - self._last_tick)
        self._last_tick = now
        self.state.update(completed_iter=runner.iter + 1, phase='train',
                          slowest_iter_s=max(self.iter_seconds, default=None))
        bound = watchdog_bound(self.iter_seconds, self.timeout, self.factor, self.min_timeout)
        self._arm(bound if bound is not None else self.slow_timeout)
        if bound is not None and not self._announced and len(self.iter_seconds) >= 5:
            self._announced = True
            if self.enabled:
                runner.logger.info(f'[mmddp_ext] hang watchdog bound: {bound:.0f} s (slowest '
                                   f'iteration so far {max(self.iter_seconds):.2f} s)')

    def after_train(self, runner) -> None:
        faulthandler.cancel_dump_traceback_later()

    # ---- slow phases ----
    def before_val(self, runner) -> None:
        self._phase('val', slow=True)

    def after_val_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        self._after_eval_iter(runner, runner.val_loop, batch_idx, 'val')

    def after_val_epoch(self, runner, metrics=None) -> None:
        self._metrics_done()

    def after_val(self, runner) -> None:
        self._phase('train', slow=True)
        self._last_tick = None  # the validation time is not an iteration time

    def before_test(self, runner) -> None:
        self._phase('test', slow=True)

    def after_test_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        self._after_eval_iter(runner, runner.test_loop, batch_idx, 'test')

    def after_test_epoch(self, runner, metrics=None) -> None:
        self._metrics_done()

    # ---- the metrics, computed on rank 0 ----
    def metric_wait(self) -> float:
        """Seconds the ranks other than 0 wait for rank 0's metrics: past both watchdog bounds,
        so that a stuck rank 0 is named by its own stack dump first."""
        return metric_bound(self.metric_seconds, self.metric_timeout, self.factor,
                            self.slow_timeout) + 2 * METRIC_GRACE

    def _after_eval_iter(self, runner, loop: Any, batch_idx: int, split: str) -> None:
        try:
            last = batch_idx + 1 == len(loop.dataloader)
        except (TypeError, AttributeError):  # no length (or no loader): the slow bound holds
            last = False
        if not last:
            self._arm(self._slow())
            return
        bound = metric_bound(self.metric_seconds, self.metric_timeout, self.factor,
                             self.slow_timeout)
        self._metric_start = time.monotonic()
        self.state['phase'] = f'{split} metrics'
        self._arm(bound if runner.rank == 0 else bound + METRIC_GRACE)
        if runner.rank == 0 and runner.world_size > 1:
            self._ticker = Ticker(self.report_every,
                                  _progress_line(runner, split, bound, self._cpu_seconds))
            self._ticker.start()

    def _metrics_done(self) -> None:
        self._stop_ticker()
        if self._metric_start is not None:
            self.metric_seconds.append(time.monotonic() - self._metric_start)
            self._metric_start = None

    def _stop_ticker(self) -> None:
        if self._ticker is not None:
            self._ticker.stop()
            self._ticker = None

    def _cpu_seconds(self) -> float:
        if self._process is None:
            self._process = psutil.Process()
        times = self._process.cpu_times()
        return times.user + times.system

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        self._arm(self._slow())
        self._last_tick = None  # saving is not iteration time either

    # ---- internals ----
    def _slow(self) -> float:
        bound = watchdog_bound(self.iter_seconds, self.timeout, self.factor, self.min_timeout)
        return max(self.slow_timeout, bound or 0.0)

    def _phase(self, phase: str, slow: bool = False) -> None:
        self.state['phase'] = phase
        if slow:
            self._arm(self._slow())
        else:
            self._write()

    def _arm(self, seconds: float) -> None:
        self.state['bound_s'] = seconds if self.enabled else None
        self._write()
        if self.enabled and self._stack_file is not None:
            faulthandler.dump_traceback_later(seconds, exit=True, file=self._stack_file)

    def _write(self) -> None:
        if self._progress is None:
            return
        self.state['time'] = time.time()
        try:
            if self._process is None:
                self._process = psutil.Process()
            self.state['rss'] = self._process.memory_info().rss
        except Exception:  # progress must never stop training
            pass
        try:
            g = gpus()
            if g.initialized():
                self.state['device_allocated'] = g.allocated(g.current())
        except Exception:
            pass
        try:
            self._progress.write(self.state)
        except OSError:
            pass


def _progress_line(runner, split: str, bound: float, cpu_seconds) -> Any:
    """The ticker's call on rank 0 while it computes the metrics: one log line, how long, how
    busy its CPU was since the last line (a stuck computation idles), and who waits."""
    last = dict(wall=time.monotonic(), cpu=cpu_seconds())

    def tick(seconds: float) -> None:
        now, cpu = time.monotonic(), cpu_seconds()
        busy = 100 * (cpu - last['cpu']) / max(now - last['wall'], 1e-9)
        last.update(wall=now, cpu=cpu)
        others = runner.world_size - 1
        runner.logger.info(
            f'[mmddp_ext] rank 0 has computed the {split} metrics for {seconds:.0f} s (CPU '
            f'{busy:.0f} % of a core); {others} other '
            f'{"ranks wait" if others > 1 else "rank waits"} for them; the hang watchdog '
            f'stops it at {bound:.0f} s '
            '(default_hooks.hang_watchdog.metric_timeout)')

    return tick
