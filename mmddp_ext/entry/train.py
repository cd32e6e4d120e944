"""The training entry behind ``tools/dist_train.py``: the config with the flags applied, every
refusal before the rendezvous (one pass: :func:`check_config`), the process group, the runner,
and a failure record when a rank raises. In the package so that ``tools/`` stays a thin shell
and :func:`mmddp_ext.launch` runs the same :func:`main` in its workers; the flags are
:mod:`.cli`'s, the ways to start it docs/launching.md.
"""
import argparse
import atexit
import contextlib
import faulthandler
import inspect
import logging
import os
import sys
from typing import List, Optional

import torch
from mmengine.config import Config
from mmengine.logging import print_log
from mmengine.registry import RUNNERS
from mmengine.runner import Runner
from torch.distributed.elastic.multiprocessing.errors import get_error_handler, record

from mmddp_launch.shared import STOPPED_EXIT_CODE
from mmddp_launch.start_up import release_run, settle_start_up

from ..checkpoint import UNSAFE_ENV
from ..ddp.join import join_job
from ..ddp.process_group import shutdown
from ..ddp.wrapper import ddp_param_names
from ..diagnose.rank_screen import print_rank_screen
from ..diagnose.records import clear_failure, note_work_dir, record_failure, stderr_path
from ..diagnose.stderr_copy import keep_stderr
from ..errors import UserError
from ..gpu import gpus
from ..hooks.memory_hook import RankMemoryHook
from ..hooks.preemption_hook import PreemptionHook, TrainingStopped
from ..launcher.env import DistEnv, read_dist_env
from ..launcher.layout import read_launch_env
from ..memory.budget import held_bytes
from ..memory.forecast import parse_size
from ..memory.stats import MemoryReader
from ..node.facts import cpus
from ..node.threads import threads_per_process
from ..runner.ddp_runner import applies_plan, runner_class
from ..runner.teardown import let_go_of_loaders
from ..scaling.apply import CheckedScaling, check_scaling
from ..utils.checks import did_you_mean
from ..utils.config import default_work_dir, load_config
from ..utils.mmcv_ops import missing_gpu_ops
from ..utils.process_state import owns_process, restore, snapshot
from ..utils.quiet import quiet_warnings
from .cli import build_parser, parse_args  # noqa: F401  (the entry's API)
from .explain import explain, render
from .forecast import forecast_memory


def share_cores(env: DistEnv, cfg: Config) -> List[str]:
    """Where the user chose no thread count, give each of this node's ranks its share of the
    node's cores, less one per DataLoader worker (:func:`threads_per_process`); the note to
    log, or none. Set before the runner is built: MMEngine's ``setup_env`` then finds
    ``OMP_NUM_THREADS`` set and leaves it."""
    workers = int((cfg.get('train_dataloader') or {}).get('num_workers', 0) or 0)
    cores = cpus()
    threads = threads_per_process(os.environ, env.local_world_size, cores, workers, env.task_cpus)
    if not env.distributed or threads is None:
        return []
    os.environ['OMP_NUM_THREADS'] = str(threads)  # for processes started later
    torch.set_num_threads(threads)
    each = f', less its {workers} DataLoader worker(s)' if workers else ''
    shared = (f'{env.task_cpus} CPUs of {env.task_cpus_of}' if env.task_cpus else
              f'{cores} cores shared by {env.local_world_size} processes on this node')
    return [
        f'threads per process: {threads} ({shared}{each}; OMP_NUM_THREADS was not set; set it '
        'to choose)'
    ]


def build_config(args: argparse.Namespace, env: Optional[DistEnv] = None) -> Config:
    """Load the config and apply the command-line switches, as MMPose's train.py does."""
    env = env or DistEnv()
    cfg = load_config(args.config, args.cfg_options)
    cfg.launcher = env.launcher
    cfg.work_dir = default_work_dir(args, cfg)
    if args.resume == 'auto':
        cfg.resume, cfg.load_from = True, None
    elif args.resume is not None:
        cfg.resume, cfg.load_from = True, args.resume
    if args.amp:
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
        cfg.optim_wrapper.setdefault('loss_scale', 'dynamic')
    if args.auto_scale_lr:
        cfg.setdefault('auto_scale_lr', {})
        cfg.auto_scale_lr.enable = True
    if args.unsafe_load or cfg.get('unsafe_load', False):
        os.environ[UNSAFE_ENV] = '1'  # read by the checkpoint loader, in every rank
    return cfg


def check_runner_type(cfg: Config) -> None:
    """One-line errors for an unknown ``runner_type`` and for a ``scaling`` block that the
    chosen runner would silently ignore."""
    runner_type = cfg.get('runner_type')
    if runner_type is not None and RUNNERS.get(runner_type) is None:
        known = sorted(RUNNERS.module_dict)
        raise UserError(f'runner_type={runner_type!r} is not a registered runner' +
                        did_you_mean(runner_type, known) +
                        f'; known: {", ".join(known)}. A custom runner needs its module in '
                        'custom_imports')
    if cfg.get('scaling') is not None and not applies_plan(runner_type):
        raise UserError(f'the config sets `scaling` but runner_type is {runner_type!r}, which '
                        "ignores it: set runner_type='DDPRunner' (or inherit "
                        'mmddp_ext::_base_/ddp_runtime.py), or remove the scaling block')


def check_config(cfg: Config, world_size: int, distributed: bool) -> Optional[CheckedScaling]:
    """What training refuses, refused before any rendezvous (and by ``--explain`` alike):
    a bad ``runner_type``, a ``scaling`` block the runner ignores, a bad ``scaling`` block,
    settings this machine cannot honour. Returns the checked block and its plan when the
    runner plans (for :func:`build_runner`, which then does not parse or plan again)."""
    check_runner_type(cfg)
    if applies_plan(cfg.get('runner_type')):
        return check_scaling(cfg, world_size, _visible_gpus() > 0, distributed)
    return None


def build_runner(cfg: Config, checked: Optional[CheckedScaling] = None,
                 env: Optional[DistEnv] = None):
    """``RUNNERS.build`` when the config names a ``runner_type`` (MMPose ignores it), else the
    stock ``Runner.from_cfg``; a runner that plans gets what :func:`check_config` checked and
    the launcher's environment (when its ``from_cfg`` takes them, as
    :class:`~mmddp_ext.runner.DDPRunner`'s does)."""

    if 'runner_type' not in cfg:
        return Runner.from_cfg(cfg)
    cls = runner_class(cfg.runner_type)
    takes = inspect.signature(cls.from_cfg).parameters
    if checked is not None and 'checked' in takes:  # what RUNNERS.build does, plus the plan
        return cls.from_cfg(cfg, checked=checked, **({'env': env} if 'env' in takes else {}))
    return RUNNERS.build(cfg)


def failure_context(runner, env: DistEnv, cfg: Optional[Config] = None) -> dict:
    """What a failure record holds besides the exception: plan, memory, wrapper settings,
    the memory budget, and what ``on_oom='microbatch'`` measured."""
    out = {'world_size': env.world_size}
    cfg = runner.cfg if runner is not None else cfg
    if cfg is not None and isinstance(cfg.get('scaling'), dict):
        out['memory_budget_mib'] = cfg.scaling.get('memory_budget_mib')
    model = getattr(runner, 'model', None)
    if getattr(model, 'failed_micro_batch', None):
        out['oom_at_batch'] = model.failed_micro_batch
    if getattr(model, 'failed_batch', None):
        out['oom_batch'] = model.failed_batch
    baseline = getattr(runner, 'trial_baseline', None)
    if baseline is not None:  # re-measured now: what training holds beyond the finder's trials

        out['finder'] = dict(max_batch=baseline.max_batch, reserve=baseline.reserve_bytes,
                             samples=baseline.samples,
                             extra=held_bytes(torch.device(baseline.device)) - baseline.held_bytes)
    plan = getattr(runner, 'scaling_plan', None)
    if plan is not None:
        out['plan'] = plan.to_dict()
    hook = next((h for h in getattr(runner, 'hooks', []) if isinstance(h, RankMemoryHook)), None)
    if hook is not None and hook.reader is not None:
        out['memory'] = hook.snapshot()
        out['stray_findings'] = hook.findings
    else:
        out['memory'] = {'now': MemoryReader(env.rank, 'cpu').read(0).to_dict()}
    if hasattr(model, 'named_parameters'):  # names for DDP's errors, which give parameter indices
        out['ddp_param_names'] = ddp_param_names(model)
    if runner is not None:
        wrapper = runner.cfg.get('model_wrapper_cfg') or {}
        if 'gradient_as_bucket_view' in wrapper:
            out['gradient_as_bucket_view'] = wrapper['gradient_as_bucket_view']
        out['per_device_batch_size'] = runner.cfg.train_dataloader.get('batch_size')
    return out


def _visible_gpus() -> int:
    return gpus().count()


def _tensors_on_gpu() -> bool:
    return gpus().tensors_on_gpu()


def stopped(runner) -> Optional[dict]:
    """What the runner's :class:`~mmddp_ext.hooks.PreemptionHook` did when a signal stopped
    the run (signal, iteration, checkpoint, requeued), else None."""
    hook = next((h for h in getattr(runner, 'hooks', []) if isinstance(h, PreemptionHook)), None)
    return hook.stopped if hook is not None else None


def _train(args: argparse.Namespace, env: DistEnv) -> int:
    work_dir = default_work_dir(args)
    runner = cfg = None
    try:
        cfg = build_config(args, env)
        work_dir = cfg.work_dir
        checked = check_config(cfg, env.world_size, env.distributed)  # before any rendezvous
        clear_failure(work_dir, env.rank)
        note_work_dir(work_dir)  # for mmddp_ext.launch(), which names the rank at fault
        if env.distributed:  # what a rank that aborts in native code says is kept
            keep_stderr(stderr_path(work_dir, env.rank))
        notes = [env.describe(), *env.warnings]
        notes += share_cores(env, cfg)
        if not applies_plan(cfg.get('runner_type')):  # DDPRunner joins in its from_cfg
            notes += join_job(cfg, env=env)  # the lean DDP wrapper, the process group
        ops = missing_gpu_ops(cfg, _tensors_on_gpu())  # said before the first iteration
        runner = build_runner(cfg, checked, env)
        if owns_process():  # a guest leaves the caller's collector alone
            settle_start_up()  # the collector on again, the start-up's objects out of its view
        for note in notes:
            print_log(f'[mmddp_ext] {note}', logger='current')
        if ops is not None:
            print_log(f'[mmddp_ext] {ops}', logger='current', level=logging.WARNING)
        runner.train()
    except TrainingStopped:  # saved; the loop could not stop mid-epoch by itself
        pass
    except BaseException as e:
        faulthandler.cancel_dump_traceback_later()  # this rank failed; it is not stuck
        record_failure(work_dir, env.rank, e, lambda: failure_context(runner, env, cfg))
        if env.distributed and owns_process() and not isinstance(e, UserError):
            # after the traceback, at the process's exit (a user error is its one line)
            atexit.register(print_rank_screen, work_dir, env.rank)
        raise
    code = STOPPED_EXIT_CODE if stopped(runner) else 0
    # Ordered teardown (runner/teardown.py): the data loaders' workers end, the runner (loops,
    # hooks, DDP model) is freed while the process group is alive, then barrier -> destroy the
    # group; nothing of the run is left for the interpreter's exit, where gloo can abort
    # ("terminate called without an active exception")
    let_go_of_loaders(runner)
    runner = None
    release_run(owns_process())
    shutdown()
    return code


def _explain(args: argparse.Namespace) -> int:
    env = read_dist_env(os.environ, args.launcher, num_gpus=0)  # no GPU is touched
    world = args.world_size if args.world_size is not None else env.world_size
    if world < 1:
        raise UserError(f'--world-size={world} must be at least 1')
    if args.device_memory is not None:
        parse_size(args.device_memory)  # a bad value fails before anything is measured
    quiet_warnings()  # the known-harmless ones, as a run filters them (put back for a guest)
    # with --json, stdout holds the one object alone: what the libraries print meanwhile
    # (pycocotools' "loading annotations into memory..." while the node figures load batches)
    # goes to stderr
    with stdout_to_stderr() if args.json else contextlib.nullcontext():
        cfg = build_config(args)
        checked = check_config(cfg, world, world > 1)
        info = explain(cfg, world, env, checked)
        if owns_process():
            settle_start_up()  # before the forecast measures a step: the collector on
        if args.memory or args.device_memory is not None:
            info['memory_forecast'] = forecast_memory(cfg, world, info['per_device_batch_size'],
                                                      env.nnodes, args.device_memory, checked)
    print(render(info, args.json), flush=True)
    return 0


@contextlib.contextmanager
def stdout_to_stderr():
    """While inside, file descriptor 1 (Python's and native code's stdout) writes to stderr."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


@record
def main(argv: Optional[List[str]] = None) -> int:
    """Train; returns the process exit code: 0 done, 1 with a one-line message for user
    mistakes, 75 (:data:`~mmddp_ext.hooks.STOPPED_EXIT_CODE`) stopped by a signal after saving
    a checkpoint (``--resume`` continues).

    Called as a library (not from ``tools/dist_train.py``), it leaves the caller's process as
    it found it (:mod:`mmddp_ext.utils.process_state`)."""
    args = parse_args(argv)
    state = snapshot()
    try:
        if args.explain:
            return _explain(args)
        env = read_launch_env(args.launcher)  # the visible GPUs counted
        return _train(args, env)
    except UserError as e:
        print(f'[mmddp_ext] error: {e}', file=sys.stderr, flush=True)
        get_error_handler().record_exception(e)  # torchrun's summary shows the same line
        return 1
    finally:
        restore(state)
