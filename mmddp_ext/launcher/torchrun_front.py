"""The front of ``tools/dist_train.sh``: check the rendezvous (:mod:`mmddp_launch.rendezvous`),
then run torchrun in this process; a failed worker ends with one line and a JSON report
(``$MMDDP_LAUNCH_REPORT``) instead of torchrun's dump. Its checks and exit codes:
docs/launching.md, "The six ways", and docs/failures.md.

Run as a script (``python mmddp_ext/launcher/torchrun_front.py --nnodes=N ... [torchrun
args]``) so that the agent does not import the package (and with it MMEngine): what it needs
comes from the launch side, :mod:`mmddp_launch` (standard library and psutil).
"""
import errno
import gc
import json
import math
import os
import signal
import socket
import sys
import threading
from typing import List, Optional, Sequence, Tuple

import psutil

from mmddp_launch import kubeflow, rendezvous
from mmddp_launch.files import atomic_write_text
from mmddp_launch.shared import OMP_UNSET_ENV, STOP_REQUESTED_ENV, STOP_SIGNALS, STOPPED_EXIT_CODE
from mmddp_launch.start_up import settle_start_up

log = rendezvous.log
REPORT_ENV = 'MMDDP_LAUNCH_REPORT'
NOTHING_STARTED = 2
# The stop signals reach the workers and leave torchrun's agent watching them: torchrun would
# turn them into its own shutdown (SIGTERM to every worker, SIGKILL 30 s later, and no exit
# code of theirs), SIGUSR1 would end the agent at once. torchrun keeps its other signals.
TORCHRUN_SIGNALS = 'SIGINT,SIGHUP,SIGQUIT'


def failure_records(failures: dict) -> List[dict]:
    """torchrun's ``ChildFailedError.failures`` ({rank: ProcessFailure}) as plain records, the
    first failure first; ``signal`` is the signal's name (``"SIGKILL"``) or None.

    The agent inserts failures in the order it saw them (the ranks it stopped itself come
    last), and whole seconds often tie, so the sort by time keeps that order for ties.
    """
    host = socket.gethostname()
    records = []
    for rank, f in sorted(failures.items(), key=lambda item: item[1].timestamp):
        try:
            name = signal.Signals(-f.exitcode).name if f.exitcode < 0 else None
        except ValueError:
            name = None
        records.append(
            dict(rank=rank, local_rank=f.local_rank, pid=f.pid, exitcode=f.exitcode, signal=name,
                 host=host, time=f.timestamp,
                 error_file=None if f.error_file == '<N/A>' else f.error_file))
    return records


def failure_line(records: Sequence[dict], more: str) -> str:
    """``torchrun: rank 1 (pid 1234) exited with signal SIGKILL; <more>`` for the first one."""
    first = records[0]
    how = f'signal {first["signal"]}' if first['signal'] else f'exit code {first["exitcode"]}'
    others = f' (first of {len(records)} failed ranks)' if len(records) > 1 else ''
    return f'torchrun: rank {first["rank"]} (pid {first["pid"]}) exited with {how}{others}; {more}'


def write_report(path: str, records: Sequence[dict]) -> None:
    """The failure records as a JSON list at ``path``, written atomically."""
    atomic_write_text(path, json.dumps(list(records), indent=1) + '\n')


def _workers_started() -> bool:
    """The rendezvous is over once the agent (this process) has started its workers."""
    try:
        return bool(psutil.Process().children())
    except Exception:
        return True  # cannot tell: stay quiet


def forward_stop_signals() -> dict:
    """Handle :data:`STOP_SIGNALS` here: each one is sent on to the workers (this process's
    children), whose ``PreemptionHook`` saves and exits with :data:`STOPPED_EXIT_CODE`; the
    agent sees their exits as it sees any other, and workers it restarts after that
    (``MAX_RESTARTS``) exit with that code at once (:data:`STOP_REQUESTED_ENV`). Before a worker
    exists the signal ends this process as it would without the handler. Returns a dict that
    gets ``signal`` (the first one's name)."""
    received: dict = {}

    def forward(signum: int, frame) -> None:
        workers = psutil.Process().children()
        if not workers:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        received.setdefault('signal', signal.Signals(signum).name)
        os.environ[STOP_REQUESTED_ENV] = received['signal']
        for worker in workers:
            try:
                worker.send_signal(signum)
            except psutil.NoSuchProcess:
                pass

    for number in STOP_SIGNALS:
        signal.signal(number, forward)
    return received


def _signal_args() -> List[str]:
    """torchrun's signals less the stop signals, where this torch has ``--signals-to-handle``
    (an older torchrun takes SIGTERM over once it starts its workers)."""
    from torch.distributed.launcher.api import LaunchConfig  # torch: after the front's checks
    if 'signals_to_handle' not in getattr(LaunchConfig, '__dataclass_fields__', {}):
        return []
    return [f'--signals-to-handle={TORCHRUN_SIGNALS}']


_OPTIONS = {
    '--nnodes': 'nnodes',
    '--node-rank': 'node_rank',
    '--master-addr': 'master_addr',
    '--master-port': 'master_port'
}


def split_args(argv: Sequence[str], environ: Optional[dict] = None) -> Tuple[dict, List[str]]:
    """The front's leading ``--name=value`` options (``dist_train.sh`` passes its ``NNODES``,
    ``NODE_RANK``, ``MASTER_ADDR`` and ``PORT`` as they are, empty where unset), completed from
    a job operator's variables (:func:`mmddp_launch.kubeflow.node_layout`) and the
    defaults, and the rest (torchrun's). ``ValueError``: one line naming the bad value."""
    opts = dict(nnodes='', node_rank='', master_addr='', master_port='')
    rest = list(argv)
    while rest and rest[0].split('=', 1)[0] in _OPTIONS and '=' in rest[0]:
        name, value = rest.pop(0).split('=', 1)
        opts[_OPTIONS[name]] = value
    nnodes, node_rank, port, note = kubeflow.node_layout(os.environ if environ is None else environ,
                                                         opts['nnodes'], opts['node_rank'],
                                                         opts['master_port'])
    if note:
        log(note)
    opts.update(nnodes=nnodes or '1', node_rank=node_rank or '0', master_port=port or None,
                master_addr=opts['master_addr'] or '127.0.0.1')
    for key, env in (('nnodes', 'NNODES'), ('node_rank', 'NODE_RANK'), ('master_port', 'PORT')):
        if opts[key] is not None and not opts[key].isdigit():
            raise ValueError(f'{env}={opts[key]!r} must be a whole number')
    if int(opts['nnodes']) < 1:
        raise ValueError(f'NNODES={opts["nnodes"]} must be at least 1')
    if int(opts['node_rank']) >= int(opts['nnodes']):
        raise ValueError(f'NODE_RANK={opts["node_rank"]} is out of range for NNODES='
                         f'{opts["nnodes"]} (0..{int(opts["nnodes"]) - 1})')
    return opts, rest


def _nproc(rest: Sequence[str]) -> int:
    """torchrun's ``--nproc_per_node=N`` among the rest of the arguments (1 when absent)."""
    for arg in rest:
        name, _, value = arg.partition('=')
        if name in ('--nproc_per_node', '--nproc-per-node') and value.isdigit():
            return int(value)
    return 1


def _prepare(opts: dict, timeout: float, log_every: float):
    """Checks before torchrun; returns (master address, port, loopback store or None)."""
    nnodes, node_rank = int(opts['nnodes']), int(opts['node_rank'])
    addr, port = opts['master_addr'], opts['master_port']
    if nnodes == 1:
        try:
            store, port = rendezvous.loopback_store('127.0.0.1', int(port or 0), timeout)
        except OSError as e:
            raise ValueError(
                rendezvous.port_in_use_message(
                    'PORT', int(port), 'leave PORT unset on a single node (a free port is picked) '
                    'or choose another') if e.errno ==
                errno.EADDRINUSE else f'cannot listen on 127.0.0.1:{port}: {e.strerror}') from None
        note = rendezvous.pin_loopback_interfaces(os.environ)
        if note:
            log(note)
        return '127.0.0.1', port, store
    port = int(port or 29500)
    if node_rank == 0 and not rendezvous.port_free(port):
        raise ValueError(
            rendezvous.port_in_use_message(
                'PORT', port, 'stop that process or choose another PORT on every node'))
    if node_rank > 0:
        error = rendezvous.wait_for_listener(
            addr, port, timeout, log_every, lambda s:
            (f'node {node_rank} waiting for node 0 at {addr}:{port} ({s:.0f} s)'))
        if error is not None:
            raise ValueError(
                f'node {node_rank} could not reach node 0 at MASTER_ADDR={addr} PORT={port} '
                f'within {timeout:.0f} s ({error}; {rendezvous.TIMEOUT_ENV} sets the wait): '
                f'{rendezvous.unreachable_causes()}')
    return addr, port, None


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Check, then run torchrun here; returns the exit code: 0 done, 1 a worker failed,
    NOTHING_STARTED (a bad setting, a port in use, an unreachable master, nodes that did not
    join), STOPPED_EXIT_CODE (every worker stopped on a signal after saving)."""
    try:
        opts, rest = split_args(sys.argv[1:] if argv is None else argv)
        mixed = kubeflow.layout_error(
            dict(os.environ), int(opts['nnodes']), int(opts['node_rank']), _nproc(rest))
        if mixed:
            raise ValueError(mixed)
        timeout = rendezvous.seconds_from_env(os.environ, rendezvous.TIMEOUT_ENV,
                                              rendezvous.DEFAULT_TIMEOUT)
        log_every = rendezvous.seconds_from_env(os.environ, rendezvous.LOG_EVERY_ENV,
                                                rendezvous.DEFAULT_LOG_EVERY)
        addr, port, store = _prepare(opts, timeout, log_every)
    except ValueError as e:
        log(f'error: {e}')
        return NOTHING_STARTED
    gc.disable()  # while torch is imported, as in tools/dist_train.py (mmddp_launch.start_up)
    # torch here, after the checks: a wrong port or address is reported before it loads
    import torch.distributed as dist
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run  # not main: its @record adds a log line
    settle_start_up()
    nnodes, node_rank = int(opts['nnodes']), int(opts['node_rank'])
    started = threading.Event()  # set when torchrun returns, or its workers run
    if nnodes > 1:
        whom = f'the other nodes (NNODES={nnodes})' if node_rank == 0 else 'the rendezvous'
        threading.Thread(
            target=rendezvous.wait_until, daemon=True,
            args=(lambda: True if started.is_set() or _workers_started() else None, math.inf,
                  log_every, lambda s: f'node {node_rank} waiting for {whom} at {addr}:{port} '
                  f'({s:.0f} s)', log_every)).start()
    args = [
        f'--nnodes={nnodes}', f'--node-rank={node_rank}', '--rdzv-backend=static',
        f'--master-addr={addr}', f'--master-port={port}',
        f'--rdzv-conf=timeout={math.ceil(timeout)}', *_signal_args(), *rest
    ]
    if not os.environ.get('OMP_NUM_THREADS'):
        os.environ[OMP_UNSET_ENV] = '1'
    received = forward_stop_signals()
    try:
        run(parse_args(args))
    except ChildFailedError as e:
        records = failure_records(e.failures)
        # PreemptionHook: the first exit is a stop after the save that every worker took part
        # in; the others may then be ended by the agent: saved, not failed
        if records and records[0]['exitcode'] == STOPPED_EXIT_CODE:
            log(f'torchrun: the workers stopped on a signal after saving a checkpoint (exit code '
                f'{STOPPED_EXIT_CODE}): --resume continues')
            return STOPPED_EXIT_CODE
        if received:
            log(f'torchrun: {received["signal"]} reached the job and its workers ended without a '
                'checkpoint (no PreemptionHook, or a rank stopped before training or after it)')
        report = os.environ.get(REPORT_ENV)
        if report:
            write_report(report, records)
        log(failure_line(records, 'diagnosis below' if report else 'worker errors above'))
        return 1
    except dist.DistError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        fix = (f'start dist_train.sh on every node with NNODES={nnodes}, its own NODE_RANK, '
               f'MASTER_ADDR=<address of this host> and PORT={port}, and check that no firewall '
               'blocks the port') if node_rank == 0 else rendezvous.unreachable_causes()
        log(f'error: node {node_rank} did not complete the rendezvous at {addr}:{port} within '
            f'{timeout:.0f} s ({rendezvous.TIMEOUT_ENV} sets the wait): {fix} (torchrun: {first})')
        return NOTHING_STARTED
    finally:
        started.set()
        del store
    return 0


if __name__ == '__main__':
    # dist_train.sh starts this front in the background, to forward stop signals to it, and
    # bash then starts it with SIGINT ignored: Ctrl-C reaches it again (and its workers)
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
