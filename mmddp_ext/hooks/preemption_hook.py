"""``PreemptionHook``: a job told to stop (SIGTERM, SIGUSR1) finishes its iteration on every
rank, saves one checkpoint and ends with exit code 75 ("stopped, not failed"); under Slurm with
``--requeue`` it requeues itself, and the next start resumes at the following iteration.

Added by :class:`~mmddp_ext.runner.DDPRunner` as the default hook ``preemption``. The story, with
what the user sees, is in docs/stopping.md.
"""
import ctypes
import os
import os.path as osp
import signal
import threading
import time
from typing import Any, Dict, Optional, Sequence

import torch
import torch.distributed as dist
from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop

from mmddp_launch.files import atomic_write_text
from mmddp_launch.shared import STOP_SIGNALS, STOPPED_EXIT_CODE

from ..launcher import ways


class TrainingStopped(SystemExit):
    """Raised after the checkpoint is saved when the train loop cannot stop mid-epoch by itself
    (a loop other than ours or MMEngine's ``IterBasedTrainLoop``); exits with code 75."""

    def __init__(self) -> None:
        super().__init__(STOPPED_EXIT_CODE)


def die_of(signum: int) -> None:
    """End this process by ``signum`` with the default action, from any thread (the C-level
    disposition is reset: Python's ``signal.signal`` works in the main thread only)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.argtypes, libc.signal.restype = [ctypes.c_int, ctypes.c_void_p], ctypes.c_void_p
        libc.signal(signum, 0)  # SIG_DFL
        os.kill(os.getpid(), signum)
    except (OSError, AttributeError):
        pass
    os._exit(128 + signum)


def _signal_numbers(names: Sequence[str]) -> Dict[int, str]:
    """``{number: name}`` of signal names such as ``'SIGTERM'`` or ``'USR1'``."""
    out = {}
    for name in names:
        full = name if str(name).startswith('SIG') else f'SIG{name}'
        num = getattr(signal, str(full), None)
        if not isinstance(num, signal.Signals):
            raise ValueError(f'PreemptionHook signals: {name!r} is not a signal of this system: '
                             "use names such as 'SIGTERM' or 'SIGUSR1'")
        out[int(num)] = num.name
    return out


@HOOKS.register_module()
class PreemptionHook(Hook):
    """Stop on a signal at an iteration boundary, agreed by all ranks, with one checkpoint.

    The signal handler only records the signal. After every training iteration each rank
    starts adding up whether one of them got it (an asynchronous ``all_reduce`` of one
    integer, on a gloo group when training on nccl), and reads the sum after the next
    iteration, when it has long arrived: so all stop after the same iteration even when only
    one rank was signalled, the iteration after the one in which the signal came, and no rank
    waits for the others in this hook (a blocking ``all_reduce`` after every iteration cost
    1.5 % of the demo's iteration, mostly waiting for the slowest rank). Under gradient
    accumulation they stop at the end of the accumulation cycle. In a single process the stop
    comes after the iteration in which the signal came. The train loop ends after that
    iteration's hooks (no rest of the epoch, no validation, no epoch checkpoint); in
    ``after_train`` rank 0 writes ``iter_N.pth`` with
    ``runner.save_checkpoint`` (atomic: a kill during the save leaves the previous checkpoint
    intact; further signals are ignored once the stop has begun) while the others wait for it,
    points ``last_checkpoint`` at it and, in a Slurm batch job that may be requeued
    (``sbatch --requeue``), runs ``scontrol requeue``. ``tools/dist_train.py`` then exits with
    :data:`STOPPED_EXIT_CODE` (75). A train loop that cannot stop mid-epoch (neither
    :class:`~mmddp_ext.runner.ResumableEpochLoop` nor ``IterBasedTrainLoop``) saves at once and
    raises :class:`TrainingStopped`.

    ``--resume`` (the requeued job's ``tools/slurm_sbatch.sh`` passes it) continues at the next
    iteration of the same epoch, skipping the batches already trained
    (:class:`~mmddp_ext.runner.ResumableEpochLoop`).

    Args:
        signals: names of the signals that ask for a stop.
        requeue: in a requeue-able Slurm batch job, requeue it after the save.
        interval: start an agreement every ``interval`` iterations (1: stop after the iteration
            after the one in which the signal came).
        grace: seconds a SIGTERM leaves for the stop (the iteration and the save); a rank
            that has not saved by then dies of it, as without this hook: torchrun and Slurm
            (``KillWait``) send SIGKILL 30 s after their SIGTERM, and a launcher that stops a
            job after a failure sends SIGTERM too. None: no limit. SIGUSR1, an advance warning,
            has none.

    Example::

        default_hooks = dict(preemption=dict(signals=['SIGUSR1']))
    """

    priority = 'HIGHEST'  # its handler must be installed before the watchdog's faulthandler

    def __init__(self, signals: Sequence[str] = tuple(s.name for s in STOP_SIGNALS),
                 requeue: bool = True, interval: int = 1, grace: Optional[float] = 25.0) -> None:
        if isinstance(signals, str):
            signals = [signals]
        self.signals = _signal_numbers(signals)
        if not isinstance(interval, int) or interval < 1:
            raise ValueError(f'PreemptionHook interval={interval!r} must be a whole number of '
                             'iterations, at least 1')
        if grace is not None and not (isinstance(grace, (int, float)) and grace > 0):
            raise ValueError(f'PreemptionHook grace={grace!r} must be a positive number of '
                             'seconds, or None (no limit)')
        self.requeue, self.interval, self.grace = requeue, interval, grace
        self._done = threading.Event()  # the stop is saved, or training is over
        self.received: Optional[str] = None  # the first stop signal, by name
        self.stopped: Optional[dict] = None  # what the stop did, once it happened
        self.signal_count = 0  # stop signals received while training
        self.agree_seconds = 0.0  # time spent in the agreement collective
        self.agreements = 0
        self._previous: Dict[int, Any] = {}
        self._active = False
        self._group = None
        self._distributed = False  # a process group existed when training began
        self._pending: Optional[tuple] = None  # (flag, work) of the agreement under way
        self._agreed = False

    # ---- signals ----
    def _handle(self, signum: int, frame: Any) -> None:
        if self._active or self.stopped is not None:
            self.signal_count += 1
            if self.received is None:
                self.received = self.signals.get(signum, str(signum))
                if signum == signal.SIGTERM and self.grace is not None and not self._done.is_set():
                    threading.Thread(target=self._expire, args=(signum, ), daemon=True).start()
            return  # a stop is on its way (or done): nothing else happens now
        previous = self._previous.get(signum)  # training is over: behave as before
        signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def _expire(self, signum: int) -> None:
        """After ``grace`` seconds without the stop saved (a rank stuck, or waiting for one that
        died: the launcher is stopping the job after a failure), die of the signal as if this
        hook were not there, so the diagnosis sees what it always saw."""
        if self._done.wait(self.grace):
            return
        die_of(signum)

    def before_run(self, runner) -> None:
        # before the HangWatchdogHook's faulthandler.register(SIGTERM, chain=True), which then
        # dumps the stacks and calls this handler
        for num in self.signals:
            try:
                self._previous[num] = signal.signal(num, self._handle)
            except (ValueError, OSError) as e:  # not the main thread
                runner.logger.warning(f'[mmddp_ext] PreemptionHook: cannot handle '
                                      f'{self.signals[num]} here ({e}): a stop signal ends the '
                                      'run without a checkpoint')
        self._active = True

    def before_train(self, runner) -> None:
        self._distributed = dist.is_available() and dist.is_initialized()
        if self._distributed:
            # the flag stays on the CPU. On gloo the default group serves: every rank queues
            # the flag's collective at the same point of its collectives (after an iteration's
            # hooks, before the next forward), and a group of its own would take address space
            # that the batch finder's CPU reserve counts
            if dist.get_backend() != 'gloo':
                self._group = dist.new_group(backend='gloo')  # all ranks call before_train
        if runner.rank == 0:
            runner.logger.info(f'[mmddp_ext] on {" or ".join(self.signals.values())} every rank '
                               'finishes its iteration, one checkpoint is saved, and the run '
                               f'exits with {STOPPED_EXIT_CODE}; --resume continues')

    # ---- the stop ----
    def _start_agreement(self) -> None:
        """Start adding up, over ranks, whether each received a stop signal. All ranks must
        call this, at the same iterations."""
        flag = torch.tensor([int(self.received is not None)], dtype=torch.int32)
        start = time.perf_counter()
        self._pending = (flag, dist.all_reduce(flag, group=self._group, async_op=True))
        self.agree_seconds += time.perf_counter() - start

    def _finish_agreement(self) -> bool:
        """Whether any rank had received a stop signal when the agreement under way started
        (False when none is under way). All ranks must call this, at the same iterations."""
        if self._pending is None:
            return False
        (flag, work), self._pending = self._pending, None
        start = time.perf_counter()
        work.wait()
        self.agree_seconds += time.perf_counter() - start
        self.agreements += 1
        return bool(flag.item())

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if self.stopped is not None:
            return
        if not self._agreed:
            due = (runner.iter + 1) % self.interval == 0
            if self._distributed:
                self._agreed = self._finish_agreement()  # started after an earlier iteration
                if not self._agreed and due:
                    self._start_agreement()
            else:
                self._agreed = due and self.received is not None
        if not self._agreed:
            return
        should_update = getattr(runner.optim_wrapper, 'should_update', None)
        if callable(should_update) and not should_update():
            return  # mid-accumulation: the gradients so far would be in no checkpoint
        self._active = False
        self.stopped = dict(signal=self.received or 'a signal to another rank',
                            iteration=runner.iter + 1, epoch=runner.epoch + 1, batch=batch_idx + 1)
        loop = runner.train_loop
        loop.stop_training = True  # the loop ends after this iteration's hooks; then after_train
        if not (getattr(loop, 'stops_mid_epoch', False) or isinstance(loop, IterBasedTrainLoop)):
            self._save(runner, runner.epoch, runner.iter + 1)  # this loop would go on
            raise TrainingStopped()

    def after_train(self, runner) -> None:
        self._finish_agreement()  # every rank started the same ones
        self._active = False
        if self.stopped is None:
            self._done.set()  # training is over: a signal now changes nothing
        if runner.rank == 0 and self.agreements:
            runner.logger.info(f'[mmddp_ext] stop-signal check: {self.agreements} all_reduce '
                               'of one integer, each started after an iteration and read after '
                               f'the next: {1e3 * self.agree_seconds / self.agreements:.3f} ms '
                               'each on average in the training loop')
        if self.stopped is not None and 'checkpoint' not in self.stopped:
            self._save(runner, runner.epoch, runner.iter)

    def _save(self, runner, epoch: int, iteration: int) -> None:
        """Save ``iter_N.pth`` (MMEngine writes on rank 0), point ``last_checkpoint`` at it, say
        what happened and, in a requeue-able Slurm batch job, requeue it (rank 0). All ranks
        must call this."""
        name = f'iter_{iteration}.pth'
        path = osp.join(runner.work_dir, name)
        runner.save_checkpoint(runner.work_dir, name, by_epoch=False,
                               meta=dict(epoch=epoch, iter=iteration))
        saved = osp.isfile(path) if runner.rank == 0 else True
        if runner.rank == 0 and saved:
            atomic_write_text(osp.join(runner.work_dir, 'last_checkpoint'), path)
        if dist.is_available() and dist.is_initialized():
            dist.barrier(group=self._group)  # rank 0 has written it
        self._done.set()
        self.stopped['checkpoint'] = path if saved else None
        where = f'iteration {self.stopped["iteration"]}'
        if isinstance(runner.train_loop, EpochBasedTrainLoop):
            where = (f'epoch {self.stopped["epoch"]}, {where} ({self.stopped["batch"]} of '
                     f'{len(runner.train_loop.dataloader)} in the epoch)')
        note = f'saved {path}' if saved else 'no checkpoint saved (see above)'
        requeued, how = False, 'continue with --resume'
        if runner.rank == 0:
            runner.logger.info(f'[mmddp_ext] stopped by {self.stopped["signal"]} after {where}: '
                               f'every rank finished it; {note}')
            done = ways.requeue(os.environ) if self.requeue and saved else None
            if done is not None:  # a scheduler's job (Slurm's): back in its queue
                requeued, how = done
            runner.logger.info(f'[mmddp_ext] {how} (exit code {STOPPED_EXIT_CODE}: stopped, not '
                               'failed)')
        self.stopped['requeued'] = requeued
