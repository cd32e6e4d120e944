"""Shared fixtures: the repository root, a small demo dataset, a subprocess runner, and real
runs made once per test session (:func:`once`) for the tests that only read their outputs."""
import contextlib
import os
import os.path as osp
import shutil
import subprocess
import sys
from typing import Callable, Dict, Iterator, List, Optional

import pytest
from filelock import FileLock

pytest_plugins = ['shared_runs']  # the real runs made once per session for the tests that read them

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEMO_CONFIG = osp.join(ROOT, 'configs', 'demo', 'td-hm_res18_1xb32-30e_demo-64x64.py')


@pytest.fixture(scope='session')
def demo_data(tmp_path_factory) -> str:
    """A small demo dataset (64 train / 16 val images), shared by the training tests (one copy
    for all workers, read only)."""
    from mmddp_ext.demo import make_demo_dataset
    return once(tmp_path_factory, 'demo_coco',
                lambda out: make_demo_dataset(out, num_train=64, num_val=16, size=96, seed=0))


def once(tmp_path_factory, name: str, build: Callable[[str], None]) -> str:
    """A folder that ``build(folder)`` fills once per test session, across pytest-xdist's
    workers too: the first worker to ask builds it under a file lock, the others wait for the
    lock and read what it left. A build that raised leaves no ``.done`` mark, so the next
    asker builds again (and fails the same way, with its own traceback). Tests that write into
    the folder take a :func:`copy_of` it instead."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get('PYTEST_XDIST_WORKER'):
        root = root.parent  # shared by the workers of this session
    folder = osp.join(str(root), f'once_{name}')
    with FileLock(folder + '.lock'):
        if not osp.exists(osp.join(folder, '.done')):
            shutil.rmtree(folder, ignore_errors=True)
            os.makedirs(folder)
            build(folder)
            open(osp.join(folder, '.done'), 'w').close()
    return folder


def copy_of(folder: str, tmp_path) -> str:
    """A private copy of a :func:`once` folder, for a test that changes what is in it. A
    ``last_checkpoint`` in it (MMEngine writes the absolute path) is re-pointed into the copy,
    as if the run had been made there."""
    dest = osp.join(str(tmp_path), osp.basename(folder))
    shutil.copytree(folder, dest, symlinks=True)
    for root, _, files in os.walk(dest):
        if 'last_checkpoint' in files:
            path = osp.join(root, 'last_checkpoint')
            with open(path) as f:
                named = f.read().strip()
            if named.startswith(folder.rstrip('/') + '/'):
                with open(path, 'w') as f:
                    f.write(dest + named[len(folder.rstrip('/')):])
    return dest


# The demo's ResNet-18 and heatmap head at a quarter of their width (1.0 M parameters instead
# of 15.4 M): the tests train the same recipe, code path and data, and a 2-process run costs
# about 28% less CPU (the gradients all-reduced, the Adam state, the checkpoints written are
# 15 times smaller; measured 18 -> 13 CPU-s). Tests whose numbers depend on the model's memory
# (the memory forecast, the batch finder's measured limits, the real out-of-memory errors)
# train the demo's own width (``slim=False``).
SLIM_HEAD_WIDTH = 64
SLIM_MODEL = {
    'model.backbone.stem_channels': '16',
    'model.backbone.base_channels': '16',
    'model.head.in_channels': '128',  # 8 × 16: the last stage's width
    'model.head.deconv_out_channels': '({0},{0},{0})'.format(SLIM_HEAD_WIDTH),
}

# the demo config's own DataLoader workers, where demo_options would turn them off
DEMO_WORKERS = {
    'train_dataloader.num_workers': '2',
    'train_dataloader.persistent_workers': 'True',
}


def demo_options(data_root: str, max_epochs: int = 2, validate: bool = False, slim: bool = True,
                 **extra: str) -> List[str]:
    """``--cfg-options`` that point the demo config at ``data_root`` and shorten it.

    ``validate``: validate after the last epoch (MMEngine's rule); without it no validation
    runs (``val_begin`` past the end), which saves a fifth of a 2-process demo run's CPU time:
    only the tests that read a metric or a best checkpoint ask for it. ``slim``: the model at
    a quarter of its width (:data:`SLIM_MODEL`; the demo pose model's keys: False for others)."""
    root = data_root.rstrip('/') + '/'
    opts = {
        **(SLIM_MODEL if slim else {}),
        'train_dataloader.dataset.data_root': root,
        'val_dataloader.dataset.data_root': root,
        'test_dataloader.dataset.data_root': root,
        'val_evaluator.ann_file': root + 'annotations/val.json',
        'test_evaluator.ann_file': root + 'annotations/val.json',
        'train_cfg.max_epochs': str(max_epochs),
        'train_cfg.val_interval': str(max_epochs),
        'train_cfg.val_begin': '1' if validate else str(max_epochs + 1),
        'default_hooks.checkpoint.interval': '1',
        'default_hooks.checkpoint.max_keep_ckpts': '-1',
        'default_hooks.logger.interval': '1',
        'train_dataloader.num_workers': '0',
        'train_dataloader.persistent_workers': 'False',
        'val_dataloader.num_workers': '0',
        'val_dataloader.persistent_workers': 'False',
        'test_dataloader.num_workers': '0',
        'test_dataloader.persistent_workers': 'False',
    }
    opts.update(extra)
    return ['--cfg-options'] + [f'{k}={v}' for k, v in opts.items()]


LAUNCHER_VARS = ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT')


def child_env(env: Optional[Dict[str, str]] = None, without=()) -> Dict[str, str]:
    """The environment of a process a test starts: this one's, unbuffered, one thread, the
    repository on ``PYTHONPATH``, less the names in ``without``, plus ``env``."""
    full = dict(os.environ, PYTHONUNBUFFERED='1', OMP_NUM_THREADS='1',
                PYTHONPATH=ROOT + os.pathsep + os.environ.get('PYTHONPATH', ''))
    for k in without:
        full.pop(k, None)
    full.update(env or {})
    return full


def run(cmd: List[str], timeout: float = 600, env: Optional[Dict[str, str]] = None,
        cwd: str = ROOT) -> subprocess.CompletedProcess:
    """Run a command to completion; output captured as text (stdout + stderr merged)."""
    return subprocess.run(cmd, cwd=cwd, env=child_env(env), timeout=timeout, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def popen(cmd: List[str], env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
    """Start a command in the repository root; launcher variables are removed unless given."""
    return subprocess.Popen(cmd, cwd=ROOT, env=child_env(env, without=LAUNCHER_VARS), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def finish(procs: List[subprocess.Popen], timeout: float = 600) -> List:
    """Wait for every process, ``timeout`` seconds in all; ``[(returncode, output), ...]``.
    Past it, AssertionError with what holds each open output (:func:`stop_hung`), killed."""
    import time
    deadline, results, hung = time.monotonic() + timeout, [], []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            results.append((proc.returncode, out))
        except subprocess.TimeoutExpired:
            hung.append(proc)
    if hung:
        report = []
        for proc in hung:
            holders = stop_hung(proc)
            out, _ = proc.communicate()
            report.append(f'output still open after {timeout:.0f} s: {proc.args}\n'
                          f'what holds it:\n{holders}\noutput tail:\n{out[-4000:]}')
        raise AssertionError('\n\n'.join(report))
    return results


def stop_hung(proc: subprocess.Popen) -> str:
    """The Python stacks of every process that holds ``proc``'s output open (it, its
    descendants, and orphans it left: any of them keeps ``communicate()`` waiting), by
    ``py-spy dump`` where it is on PATH, then SIGKILL to all of them, so a hang shows where it
    waited and leaves nothing behind."""
    import psutil
    holders, pipe = [], None
    if getattr(proc, 'stdout', None) is None:  # a forked rank (``preloaded.Forked``): its tree
        try:
            top = psutil.Process(proc.pid)
            holders = [top] + top.children(recursive=True)
        except psutil.Error:
            pass
    else:
        pipe = f'pipe:[{os.fstat(proc.stdout.fileno()).st_ino}]'
    for p in psutil.process_iter() if pipe else ():
        try:
            fds = os.listdir(f'/proc/{p.pid}/fd')
            if p.pid != os.getpid() and any(
                    os.readlink(f'/proc/{p.pid}/fd/{fd}') == pipe for fd in fds):
                holders.append(p)
        except (OSError, psutil.Error):
            continue
    stacks = [f'{proc.args[0]} (pid {proc.pid}): exit code {proc.poll()}']
    for p in holders:
        try:
            stacks.append(f'pid {p.pid} (parent {p.ppid()}): {" ".join(p.cmdline())[:300]}')
        except psutil.Error:
            continue
        if shutil.which('py-spy'):
            dump = subprocess.run(['py-spy', 'dump', '--pid', str(p.pid)], text=True,
                                  capture_output=True, timeout=60)
            stacks.append(dump.stdout if dump.returncode == 0 else '(not a Python process)')
    for p in holders:
        try:
            p.kill()
        except psutil.Error:
            pass
    return '\n'.join(stacks)


@contextlib.contextmanager
def mmengine_log() -> Iterator[List[str]]:
    """The messages MMEngine's current logger emits inside the block, as they come (its
    logger does not propagate to pytest's ``caplog``)."""
    import logging

    from mmengine.logging import MMLogger
    seen: List[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger = MMLogger.get_current_instance()
    logger.addHandler(handler)
    try:
        yield seen
    finally:
        logger.removeHandler(handler)


def check_ok(proc) -> str:
    """Assert a zero exit of a finished process (``returncode`` and ``stdout``, or ``out``);
    on failure show the tail of the output."""
    out = proc.out if hasattr(proc, 'out') else proc.stdout
    assert proc.returncode == 0, f'exit {proc.returncode}; output tail:\n{out[-6000:]}'
    return out


PYTHON = sys.executable


def assert_not_trained(out: str) -> None:
    """The run stopped before its first training iteration."""
    assert 'Epoch(train)' not in out and 'Iter(train)' not in out, out[-3000:]


def assert_no_debris(work_dir) -> None:
    """No checkpoint and no half-written file anywhere under ``work_dir``."""
    import glob
    assert not glob.glob(osp.join(str(work_dir), '**', '*.pth'), recursive=True)
    assert not glob.glob(osp.join(str(work_dir), '**', '.*.part'), recursive=True)


def stop_point_by_hand(config: str, work: str, data: str, extra=(),
                       options: Optional[Dict[str, str]] = None) -> list:
    """The 2 ranks of a preemption test's run (``tests.helpers.stop_point_hook``: 2 epochs of
    8 iterations), started by hand (RANK, WORLD_SIZE, MASTER_*) from the preloaded stack
    (``preloaded.by_hand``: read as ``subprocess.Popen`` objects); ``options`` change
    :func:`demo_options`' (e.g. the demo's own DataLoader workers, :data:`DEMO_WORKERS`)."""
    from preloaded import by_hand
    from tests.helpers.stop_point_hook import STOP_OPTIONS
    args = [
        config, '--work-dir', work, *extra,
        *demo_options(data, 2, **STOP_OPTIONS, **(options or {}))
    ]
    return by_hand(args, work + '_ranks')


def demo_with_hooks(tmp_path, hooks: str, modules=(), name: str = 'demo_hooks.py') -> str:
    """A config file: the demo plus ``custom_hooks`` (Python source of the list's items) and
    the test-helper modules that define them."""
    path = osp.join(str(tmp_path), name)
    imports = ['mmddp_ext'] + [f'tests.helpers.{m}' for m in modules]
    with open(path, 'w') as f:
        f.write(f"_base_ = [{DEMO_CONFIG!r}]\n"
                f"custom_imports = dict(imports={imports!r}, allow_failed_imports=False)\n"
                f"custom_hooks = [dict(type='SyncBuffersHook'), {hooks}]\n")
    return path


def recording_config(tmp_path, record_dir: str) -> str:
    """The demo config plus :class:`RankRecordHook` writing to ``record_dir``."""
    return demo_with_hooks(tmp_path, f"dict(type='RankRecordHook', out_dir={record_dir!r})",
                           ['rank_record_hook'], 'demo_recorded.py')


def read_records(record_dir: str) -> dict:
    """``{rank: record}`` written by RankRecordHook."""
    import glob
    import json
    out = {}
    for p in glob.glob(osp.join(record_dir, 'rank*.json')):
        rec = json.load(open(p))
        out[rec['dist_rank']] = rec
    return out


def written_recipe(config: str) -> dict:
    """What a recipe config says as written, read with MMEngine alone (no planning code):
    ``cfg``, the per-device ``batch``, the ``base`` batch of ``auto_scale_lr``, the
    ``global_batch`` it was written for (N × M of its ``NxbM`` name, else the base batch) and
    the optimizer's ``lr``."""
    import re

    from mmengine.config import Config

    from mmddp_ext.utils.config import resolve_config_path
    path = resolve_config_path(config)
    cfg = Config.fromfile(path)
    named = re.search(r'(?:^|[_-])(\d+)xb(\d+)(?:[_-]|\.py$)', osp.basename(path))
    base = (cfg.get('auto_scale_lr') or {}).get('base_batch_size')
    return dict(cfg=cfg, batch=cfg.train_dataloader.batch_size, base=base,
                global_batch=int(named[1]) * int(named[2]) if named else base,
                lr=cfg.optim_wrapper.optimizer.lr)


def recipe_expectation(config: str, world: int) -> dict:
    """The plan a recipe config implies on ``world`` processes, from the rules alone: the
    global batch is kept; the per-device batch is the largest one within the written batch
    that splits global / world evenly, the rest is accumulation; the LR scales linearly with
    global / base; iteration counts are multiplied by ``iter_scale`` = samples per iteration
    as written / now, so that the samples seen stay the same."""
    w = written_recipe(config)
    global_batch = w['global_batch']
    per_rank = global_batch // world
    per_device = max(d for d in range(1, min(w['batch'], per_rank) + 1) if per_rank % d == 0)
    return dict(per_device_batch_size=per_device, accumulative_counts=per_rank // per_device,
                global_batch_size=global_batch, base_batch_size=w['base'],
                lr_scale=global_batch / w['base'], lrs=[w['lr'] * global_batch / w['base']],
                iter_scale=global_batch / (per_device * world))


# the fixtures of tests/shared_runs.py: a test that reads one depends on a real training
SHARED_RUNS = frozenset(('healthy_run', 'two_jobs', 'trained_demo', 'stop_point_reference'))


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(config, items) -> None:
    """A test that reads a shared run is ``slow`` too (``-m "not slow"`` leaves it out, and it
    is scheduled with the trainings). The real trainings (``slow``) first, the rest after them,
    each in file order: with
    ``-n 2 --dist load --maxschedchunk 1`` each worker is handed the next test when it is done
    with one, so the long runs go to both workers from the start and the short tests fill the
    gaps at the end, instead of one long run starting last while the other worker is idle.
    (``--dist worksteal`` would give the first half of this order, nearly every real training,
    to one worker; plain ``--dist load`` hands each worker an eighth of it up front.) The tests
    marked ``waits`` go one after each of the first trainings."""
    for item in items:
        if SHARED_RUNS & set(getattr(item, 'fixturenames', ())):
            item.add_marker(pytest.mark.slow)
    waits = [item for item in items if item.get_closest_marker('waits')]
    slow = [item for item in items if item.get_closest_marker('slow') and item not in waits]
    rest = [item for item in items if item not in waits and item not in slow]
    # one test that waits after each of the first trainings: its worker leaves a core idle,
    # which the other worker's two ranks then use (at the end, beside in-process tests, it
    # would stay idle). xdist keeps a second test queued per worker, so which worker draws a
    # waiting test depends on timing: the pairing holds only roughly
    first = [item for pair in zip(slow, waits) for item in pair]
    items[:] = first + slow[len(waits):] + waits[len(slow):] + rest


# With MMDDP_ONLY_GPU_SKIPS=1 (.ci/run sets it) a skip that does not name a GPU fails the run:
# Slurm, mpirun, mount namespaces and cgroups are all there on a CI machine, so their tests
# skipping means the install or the machine lost something.
ONLY_GPU_SKIPS = 'MMDDP_ONLY_GPU_SKIPS'
_unexpected_skips: List[str] = []


def _is_gpu_skip(reason: str) -> bool:
    return any(word in reason for word in ('GPU', 'NVIDIA', 'CUDA'))


def pytest_runtest_logreport(report) -> None:
    if os.environ.get(ONLY_GPU_SKIPS) == '1' and report.skipped and not hasattr(report, 'wasxfail'):
        reason = str(report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr)
        reason = reason[len('Skipped: '):] if reason.startswith('Skipped: ') else reason
        if not _is_gpu_skip(reason):
            _unexpected_skips.append(f'{report.nodeid}: {reason}')


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus) -> None:
    if _unexpected_skips and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter) -> None:
    if _unexpected_skips:
        terminalreporter.section(f'{ONLY_GPU_SKIPS}=1: skips that are not a missing GPU')
        for line in _unexpected_skips:
            terminalreporter.write_line(line)
        terminalreporter.write_line('each of these is a test this machine should run: install '
                                    'what it names (bash tools/install.sh --with-tests as root)')
