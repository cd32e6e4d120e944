"""``tools/dist_train.py`` in processes forked from one that has imported the stack already.

Each Python process the tests start imports torch, MMEngine, MMCV, MMPose and mmddp_ext before
it does anything, and the short trainings of the suite spend most of their CPU there
(docs/benchmarks.md, "Test suite"). Where the way the processes are started is not what a test
is about, it starts them here instead: from multiprocessing's fork server, started once per
pytest worker with the stack imported (``set_forkserver_preload``) and nothing computed (so no
thread pool is forked). Each process then runs the script itself as ``__main__`` (``runpy``),
with its own environment, arguments and working directory, its stdout and stderr in a file; by
hand, as a user starting ``RANK``/``WORLD_SIZE``/``MASTER_*`` processes would, where ``nproc``
> 1. What the launchers themselves do (torchrun, ``dist_train.sh``, Slurm, mpirun,
``launch()``) keeps its real processes in the tests of those launchers.
"""
import atexit
import multiprocessing
import multiprocessing.connection
import os
import os.path as osp
import runpy
import subprocess
import sys
import time
import traceback
from typing import Dict, List, Optional

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
SCRIPT = osp.join(ROOT, 'tools', 'dist_train.py')
DIAGNOSE = osp.join(ROOT, 'tools', 'diagnose.py')
# what every training imports (the demo is MMPose's; MMDetection is imported where a config
# names it): the fork server imports these once, each process it forks has them
PRELOAD = [
    'torch', 'mmengine.runner', 'mmcv.ops', 'mmpose.models', 'mmpose.datasets', 'mmpose.evaluation',
    'mmpose.visualization', 'mmpose.engine', 'mmddp_ext.entry.train'
]
# environment of the fork server (read by libraries when they load, e.g. OpenMP's thread count)
SERVER_ENV = {'OMP_NUM_THREADS': '1', 'PYTHONUNBUFFERED': '1', 'NO_ALBUMENTATIONS_UPDATE': '1'}

_context = None


def fork_server():
    """multiprocessing's fork-server context, its server started with the stack imported."""
    global _context
    if _context is None:
        saved = {k: os.environ.get(k) for k in SERVER_ENV}
        os.environ.update(SERVER_ENV)
        try:
            _context = multiprocessing.get_context('forkserver')
            _context.set_forkserver_preload(PRELOAD)
            from multiprocessing import forkserver
            forkserver.ensure_running()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return _context


def _run_script(script: str, argv: List[str], env: Dict[str, str], log: str) -> None:
    """In the forked process: ``script`` as ``__main__``, as ``python SCRIPT ARGV`` runs it."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(ROOT)
    sys.argv = [script, *argv]
    code = 0
    try:
        runpy.run_path(script, run_name='__main__')
    except SystemExit as e:  # as the interpreter reads it: None 0, a number, else printed and 1
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: B902 - as the interpreter would: the traceback, exit 1
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()  # what the interpreter runs at exit; forked children skip it
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class Ranks:
    """The processes of one run: ``wait()`` returns ``[(returncode, output), ...]`` by rank
    (a negative code: killed by that signal)."""

    def __init__(self, procs, logs) -> None:
        self.procs, self.logs = procs, logs

    def wait(self, timeout: float = 600, grace: float = 30) -> List:
        """Wait for every process; once one fails, the others are stopped as torchrun stops a
        job's workers (SIGTERM, SIGKILL after ``grace`` seconds)."""
        deadline = time.monotonic() + timeout
        stop_at = None
        while any(p.exitcode is None for p in self.procs):
            now = time.monotonic()
            if now > deadline:
                for p in self.procs:
                    p.kill()
                raise TimeoutError(f'{self.logs}: still running after {timeout} s')
            if stop_at is None and any(p.exitcode not in (None, 0) for p in self.procs):
                stop_at = now + grace
                for p in self.procs:
                    if p.exitcode is None:
                        p.terminate()
            elif stop_at is not None and now > stop_at:
                for p in self.procs:
                    if p.exitcode is None:
                        p.kill()
            multiprocessing.connection.wait([p.sentinel for p in self.procs if p.exitcode is None],
                                            timeout=1)
        results = []
        for proc, log in zip(self.procs, self.logs):
            with open(log) as f:
                results.append((proc.exitcode, f.read()))
        return results


class Forked:
    """One process :func:`start` forked, read as ``conftest.finish`` and the tests read a
    ``subprocess.Popen``: ``pid``, ``args``, ``poll()`` and ``returncode`` (negative: killed by
    that signal), ``communicate(timeout)`` (its output, once it ended), ``send_signal``."""

    def __init__(self, proc, log: str, args: List[str]) -> None:
        self.proc, self.log, self.args, self.pid = proc, log, args, proc.pid

    def poll(self) -> Optional[int]:
        return self.proc.exitcode

    @property
    def returncode(self) -> Optional[int]:
        return self.proc.exitcode

    def send_signal(self, signum: int) -> None:
        """As ``Popen.send_signal``: nothing once the process has ended."""
        if self.proc.exitcode is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:  # it ended meanwhile
                pass

    def communicate(self, timeout: Optional[float] = None):
        self.proc.join(timeout)
        if self.proc.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        with open(self.log) as f:
            return f.read(), None


def by_hand(args: List[str], out_dir: str, nproc: int = 2,
            env: Optional[Dict[str, str]] = None) -> List[Forked]:
    """:func:`start`'s ranks (by hand), each read as a ``subprocess.Popen`` (:class:`Forked`)."""
    ranks = start(args, out_dir, nproc, env)
    return [Forked(p, log, [SCRIPT, *args]) for p, log in zip(ranks.procs, ranks.logs)]


def start(args: List[str], out_dir: str, nproc: int = 1, env: Optional[Dict[str, str]] = None,
          port: Optional[int] = None, script: str = SCRIPT, one_log: bool = False) -> Ranks:
    """Start ``tools/dist_train.py ARGS`` in ``nproc`` processes (by hand where more than one:
    ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` on loopback), each
    with this process's environment plus ``env``, as ``conftest.run`` sets it; their output
    goes to ``out_dir/rank<N>.out``, or with ``one_log`` all to ``out_dir/ranks.out`` in the
    order it is written (as a launcher's ranks share its terminal)."""
    from mmddp_launch.rendezvous import find_free_port

    from conftest import LAUNCHER_VARS, child_env  # here: not in the forked processes
    ctx = fork_server()
    layout = {}
    if nproc > 1:
        layout = dict(
            WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR='127.0.0.1',
            MASTER_PORT=str(port or find_free_port()))
    base = child_env({**layout, **(env or {})}, without=LAUNCHER_VARS + ('LOCAL_WORLD_SIZE', ))
    os.makedirs(out_dir, exist_ok=True)
    procs, logs = [], []
    for rank in range(nproc):
        rank_env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank)) if nproc > 1 else base
        log = osp.join(out_dir, 'ranks.out' if one_log else f'rank{rank}.out')
        if rank == 0 or not one_log:
            open(log, 'w').close()  # a new run's output, not added to an earlier one's
        proc = ctx.Process(target=_run_script, args=(script, list(args), rank_env, log))
        proc.start()
        procs.append(proc)
        logs.append(log)
    return Ranks(procs, logs)


def train(args: List[str], out_dir: str, env: Optional[Dict[str, str]] = None,
          timeout: float = 600) -> subprocess.CompletedProcess:
    """``python tools/dist_train.py ARGS`` in one process, to its end (as ``conftest.run``
    returns it)."""
    (code, out), = start(args, out_dir, 1, env).wait(timeout)
    return subprocess.CompletedProcess([SCRIPT, *args], code, out)


def dist_train(args: List[str], nproc: int, out_dir: str, env: Optional[Dict[str, str]] = None,
               timeout: float = 600, diagnose: bool = False) -> subprocess.CompletedProcess:
    """``tools/dist_train.py ARGS`` on ``nproc`` ranks started by hand, to their end: the first
    failing rank's exit code (else 0) and the ranks' output as they wrote it. ``diagnose``:
    after a failure, ``tools/diagnose.py --train-args ARGS``, as ``dist_train.sh`` runs it
    (its screen comes last in the output)."""
    if diagnose:  # as dist_train.sh's front: the job's screen comes from the diagnosis alone
        env = dict(env or {}, MMDDP_LAUNCH_REPORT=osp.join(out_dir, 'launch_report.json'))
    results = start(args, out_dir, nproc, env, one_log=True).wait(timeout)
    code = next((c for c, _ in results if c != 0), 0)
    out = results[0][1]
    if diagnose and code not in (0, 2, 75):  # dist_train.sh's rule: 2 and 75 say why themselves
        (_, screen), = start(['--train-args', *args], osp.join(out_dir, 'diagnose'), 1, env,
                             script=DIAGNOSE).wait(timeout)
        out += screen
    return subprocess.CompletedProcess([SCRIPT, *args], code, out)
