"""``DDPRunner``: MMEngine's Runner with the scaling plan applied before anything is built
(``runner_type = 'DDPRunner'``; ``mmddp_ext::_base_/ddp_runtime.py`` sets it).

:meth:`DDPRunner.from_cfg` plans (or takes the plan the entry made,
:func:`~mmddp_ext.scaling.apply.check_scaling`), measures ``max_batch_per_device='auto'``
(:mod:`.batch_finder`) and applies the plan to a copy of the config; ``register_default_hooks``
adds :data:`~mmddp_ext.runner.default_hooks.DEFAULT_HOOKS` as ``default_hooks`` keys beside
MMEngine's own; the other methods are MMEngine's, each extended where its name says.
What that adds for a user is the README's list under "Use it in your configs"; the plan is
docs/scaling.md, checkpoints docs/checkpoints.md.
"""
import contextlib
import os
import os.path as osp
from typing import Any, Optional, Tuple

import torch.distributed as dist
from mmengine.dist import is_main_process
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.registry import MODEL_WRAPPERS, RUNNERS
from mmengine.runner import Runner

from mmddp_launch.files import move_into_place

from ..agreement.collective import agree_or_stop, view_of
from ..batch_finder.finder import find_max_batch
from ..checkpoint import from_plain, refuse_nonfinite, save_error, to_plain
from ..dataloader.shared_batches import share_batches
from ..dataloader.workers import tie_workers
from ..ddp.join import join_job
from ..ddp.process_group import ensure_process_group
from ..ddp.wrapper import ddp_param_names, sync_bn_for_rank, with_rank_device
from ..errors import ScalingError
from ..global_loss.log_processor import log_processor_cfg
from ..gpu import gpus, rank_device
from ..hooks.finite_checkpoint_hook import finite_checkpoint_type
from ..launcher.env import DistEnv
from ..launcher.layout import read_launch_env
from ..memory.budget import apply_budget, checkpoint_writing
from ..scaling.apply import CheckedScaling, apply_plan, check_scaling, plan_for_config
from ..scaling.config import ScalingConfig
from ..utils.log import log_line
from ..utils.process_state import restore, snapshot
from ..utils.quiet import quiet_logger, quiet_warnings
from .config_text import TextOnceConfig
from .default_hooks import hook_type_name, our_default_hooks
from .evaluation import RankEvaluation
from .resumable_loop import resumable_loop_cfg
from .work_dir import share_work_dir


def _world_size(launcher: str) -> int:
    """The job's world size: the process group's once one exists, else the one reader of the
    launcher's variables (:func:`~mmddp_ext.launcher.layout.read_launch_env`), whose reading
    the process group's start then uses."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return read_launch_env(launcher).world_size


def _agreement_on(cfg: Any) -> bool:
    """Whether the ranks' agreement runs (before the model is wrapped too): False when
    ``default_hooks.rank_agreement`` is None or has ``enabled=False``, or when the config
    lists ``dict(type='AgreementHook', enabled=False)`` in ``custom_hooks``."""
    hooks = our_default_hooks(cfg.get('default_hooks'), cfg.get('custom_hooks'))
    listed = [h for h in cfg.get('custom_hooks') or [] if hook_type_name(h) == 'AgreementHook'
              ] + ([hooks['rank_agreement']] if 'rank_agreement' in hooks else [])
    return bool(listed) and all(
        (h.get('enabled', True) if isinstance(h, dict) else getattr(h, 'enabled', True))
        for h in listed)


def _measure(cfg: Any, checked: CheckedScaling) -> Tuple[Optional[int], Optional[tuple], Any]:
    """Apply ``scaling.memory_budget_mib`` and, for ``max_batch_per_device='auto'``, measure
    the per-device batch that fits on every rank (:mod:`mmddp_ext.batch_finder.finder`).

    Returns:
        The measured batch (or None), where it is stored, ``(path, key)`` (or None), and
        what this rank held between the trials (a ``TrialBaseline``, or None).
    """
    scaling, world_size = checked.scaling, checked.world_size
    if scaling.memory_budget_mib is None and not scaling.probe:
        return None, None, None
    device = rank_device()  # LOCAL_RANK's: the process group's start pinned it
    budget = apply_budget(scaling.memory_budget_mib, device)
    if not scaling.probe:
        if budget is not None:  # the finder says it in its own first line
            log_line(f'memory budget: {budget.how}', rank0_only=True)
        return None, None, None

    # the samples per rank per step: what a per-device batch can be at most, whatever the cap
    upper = checked.plan.per_device_batch_size * checked.plan.accumulative_counts
    found, baseline, stored = find_max_batch(cfg, world_size, upper, budget,
                                             scaling.memory_budget_mib, device)
    return found.max_batch, stored, baseline


def checked_or_refused(
        cfg: Any, world_size: int, cuda: bool,
        distributed: bool) -> Tuple[Optional[CheckedScaling], Optional[ScalingError]]:
    """:func:`~mmddp_ext.scaling.apply.check_scaling`, or the error it raised."""
    try:
        return check_scaling(cfg, world_size, cuda, distributed), None
    except ScalingError as e:
        return None, e


def has_training_parts(cfg: Any) -> bool:
    """Whether ``cfg`` has the training parts (``train_dataloader``, ``train_cfg`` and
    ``optim_wrapper``). Without them, e.g. a config built only to validate or test, there is
    nothing to plan; MMEngine itself rejects a config that has only some of them."""
    return all(
        cfg.get(key) is not None for key in ('train_dataloader', 'train_cfg', 'optim_wrapper'))


def runner_class(runner_type: Any) -> Optional[type]:
    """The runner class a config's ``runner_type`` names (a name in MMEngine's registry or a
    class), or None when it names none."""
    if runner_type is None or isinstance(runner_type, type):
        return runner_type
    try:
        cls = RUNNERS.get(runner_type)
    except (KeyError, TypeError):
        cls = None
    if cls is None and str(runner_type).split('.')[-1] == 'DDPRunner':
        cls = DDPRunner  # 'mmddp_ext.DDPRunner': the scope of our own registration
    return cls if isinstance(cls, type) else None


def applies_plan(runner_type: Any) -> bool:
    """Whether ``runner_type`` (a config's) names :class:`DDPRunner` or a registered subclass,
    i.e. a runner that applies the ``scaling`` plan."""
    cls = runner_class(runner_type)
    return cls is not None and issubclass(cls, DDPRunner)


@RUNNERS.register_module()
class DDPRunner(RankEvaluation, Runner):
    """A Runner whose batch size, accumulation, LR and schedule follow the ``scaling`` plan.

    Construct it with :meth:`from_cfg` (``RUNNERS.build(cfg)`` does). Attributes added to the
    stock Runner:

    Attributes:
        scaling_plan: the :class:`~mmddp_ext.scaling.ScalingPlan` of this run.
        scaling_changes: the config changes the plan made, as ``key: old → new`` lines.
        batch_probe: where the finder's result is stored, with
            ``max_batch_per_device='auto'``
            (:class:`~mmddp_ext.batch_finder.cache.StoredResult`), else None.
        trial_baseline: what this rank held between the finder's trials
            (:class:`~mmddp_ext.batch_finder.finder.TrialBaseline`), when it measured in this
            run; :class:`~mmddp_ext.hooks.ScalingHook` compares training with it.
    """

    scaling_plan = None
    scaling_changes: Tuple[str, ...] = ()
    batch_probe: Any = None
    trial_baseline = None
    training_refused: Optional[ScalingError] = None  # a plan refused: train() raises it
    process_state: Optional[dict] = None  # a guest's process as from_cfg found it

    def train(self) -> Any:
        """MMEngine's training, unless the plan was refused; then the caller's process as it
        was (:mod:`~mmddp_ext.utils.process_state`)."""
        try:
            if self.training_refused is not None:
                raise self.training_refused
            return super().train()
        finally:
            restore(self.process_state)

    def val(self) -> Any:
        """MMEngine's validation; then the caller's process as it was."""
        try:
            return super().val()
        finally:
            restore(self.process_state)

    def test(self) -> Any:
        """MMEngine's test; then the caller's process as it was."""
        try:
            return super().test()
        finally:
            restore(self.process_state)

    @classmethod
    def from_cfg(cls, cfg: Any, checked: Optional[CheckedScaling] = None,
                 env: Optional[DistEnv] = None) -> 'DDPRunner':
        """Plan, apply the plan to a copy of ``cfg``, then build the Runner.

        ``checked``: what the entry point parsed, checked and planned already for this world
        size (:func:`~mmddp_ext.scaling.apply.check_scaling`; ``tools/dist_train.py`` passes
        it); without it that is done here. A config without training parts
        (:func:`has_training_parts`) is built unplanned, as MMEngine's Runner builds it (the
        ``scaling`` block does not apply); distributed runs still get the lean DDP wrapper and
        our hooks. So is one whose plan this world size refuses: ``train()`` raises the
        refusal, ``val()`` and ``test()`` run (MMPose's and MMDetection's ``tools/test.py``
        build the whole config's runner and only test, on however many GPUs there are).
        ``env``: the launcher's environment, when the entry point read it already.

        Before the finder and the Runner, the run's model wrapper is chosen and the process
        group started (:func:`~mmddp_ext.ddp.join.join_job`).
        """
        state = snapshot()  # a guest's process as it was, when the run ends (process_state)
        try:
            runner = cls._from_cfg(cfg, checked, env)
        except BaseException:
            restore(state)
            raise
        runner.process_state = state
        return runner

    @classmethod
    def _from_cfg(cls, cfg: Any, checked: Optional[CheckedScaling],
                  env: Optional[DistEnv]) -> 'DDPRunner':
        cfg = TextOnceConfig.copy_of(cfg)  # formatted once, not at every pretty_text
        launcher = cfg.get('launcher', 'none')
        world_size = env.world_size if env is not None else _world_size(launcher)
        training = has_training_parts(cfg)
        distributed = launcher != 'none'
        refused = None  # a plan refused for this world size: train() raises it, test() runs
        if training and (checked is None or checked.world_size != world_size):
            checked, refused = checked_or_refused(cfg, world_size, gpus().available(), distributed)
            training = refused is None
        # nothing to train: nothing to plan, nothing to measure
        scaling = checked.scaling if training else ScalingConfig()
        # the wrapper and the process group: before the finder, which measures on this
        # rank's device (pinned by the group's start) and with the run's wrapper
        for note in join_job(cfg, scaling, env):  # every rank says its backend
            print_log(f'[mmddp_ext] {note}', logger='current')
        plan, changes, stored, baseline = None, [], None, None
        if training:
            measured, stored, baseline = _measure(cfg, checked)
            plan = checked.plan if measured is None else plan_for_config(
                cfg, world_size, max_batch_per_device=measured, scaling=scaling)
            changes = apply_plan(cfg, plan)
        runner = super().from_cfg(cfg)
        runner.scaling_plan = plan
        runner.scaling_changes = changes
        runner.batch_probe = stored
        runner.trial_baseline = baseline
        runner.training_refused = refused
        return runner

    def build_train_loop(self, loop: Any) -> Any:
        """MMEngine's train loop; the epoch-based one is a ``ResumableEpochLoop``."""
        return super().build_train_loop(resumable_loop_cfg(loop))

    def wrap_model(self, model_wrapper_cfg: Optional[dict], model: Any) -> Any:
        """MMEngine's wrapping, with this rank's device given to DDP here, not in the config
        (:func:`~mmddp_ext.ddp.wrapper.with_rank_device`); on CPUs (gloo) SyncBN layers become
        BatchNorm and ``sync_bn`` is ignored (:func:`~mmddp_ext.ddp.wrapper.sync_bn_for_rank`,
        which on the fake GPU host first decides as a GPU rank does); in a
        single process, ``MicrobatchDDP`` when the config asks for it (MMEngine wraps only
        distributed models). Before a distributed model is wrapped, every rank's parameters,
        config and versions are compared (:func:`~mmddp_ext.agreement.collective.agree_or_stop`): a
        rank that built another model stops every rank with a table, not with DDP's shape
        error. An error while wrapping carries ``ddp_param_names``, which the failure record
        keeps."""
        if self.distributed:
            model, note = sync_bn_for_rank(model, self.cfg.get('sync_bn'))
            if not gpus().tensors_on_gpu():
                self.cfg.sync_bn = None  # MMEngine would convert them back
            model_wrapper_cfg, device_note = with_rank_device(model_wrapper_cfg)
            for line in (note, device_note):
                if line:
                    print_log(f'[mmddp_ext] {line}', logger='current')
        if self.distributed and self.world_size > 1 and _agreement_on(self.cfg):
            # before DDP's own shape check
            agree_or_stop(*view_of(model, self.cfg), self.rank, self.logger)
        try:
            model = super().wrap_model(model_wrapper_cfg, model)
        except Exception as e:  # DDP's check that the models agree: the record names them
            e.ddp_param_names = ddp_param_names(model)
            raise
        if (not self.distributed and model_wrapper_cfg
                and model_wrapper_cfg.get('type') == 'MicrobatchDDP'
                and not is_model_wrapper(model)):
            model = MODEL_WRAPPERS.build(dict(model_wrapper_cfg), default_args=dict(module=model))
        return model

    def call_hook(self, fn_name: str, **kwargs) -> None:
        """MMEngine's hook calls, with checkpoints that plain ``torch.load`` opens.

        After every hook ran ``before_save_checkpoint``, the checkpoint about to be written
        is converted with :func:`~mmddp_ext.checkpoint.to_plain` (message hub history
        buffers, numpy arrays and scalars become tensors and plain values); before any hook
        runs ``after_load_checkpoint``, a loaded one is converted back with
        :func:`~mmddp_ext.checkpoint.from_plain`, so hooks and ``resume`` (which restores
        the message hub afterwards) see what was saved. Both change the checkpoint dict in
        place: MMEngine keeps using that same dict.
        """
        checkpoint = kwargs.get('checkpoint')
        if fn_name == 'after_load_checkpoint' and isinstance(checkpoint, dict):
            checkpoint.update(from_plain(checkpoint))
        super().call_hook(fn_name, **kwargs)
        if fn_name == 'before_save_checkpoint' and isinstance(checkpoint, dict):
            checkpoint.update(to_plain(checkpoint))

    def save_checkpoint(self, out_dir: str, filename: str, file_client_args=None,
                        save_optimizer: bool = True, save_param_scheduler: bool = True, meta=None,
                        by_epoch: bool = True, backend_args=None) -> None:
        """MMEngine's save, made atomic for local files: write ``.<name>.part``, fsync,
        rename, outside a CPU memory budget (:func:`~mmddp_ext.memory.budget.checkpoint_writing`).
        A crash mid-save leaves the previous file of that name intact, and the
        CheckpointHook updates ``last_checkpoint`` only after this returns. A full disk
        (or quota) is one error line: the path, the free space, the previous checkpoint; so
        is a folder that refuses new files (permissions, read-only, immutable, gone).

        Weights with a NaN or Inf are not saved: one log line names them and nothing is
        written (:func:`~mmddp_ext.checkpoint.nonfinite_tensors`)."""
        if refuse_nonfinite(self, filename):
            return None
        args = (file_client_args, save_optimizer, save_param_scheduler, meta, by_epoch,
                backend_args)
        if file_client_args or backend_args or '://' in str(out_dir):
            with checkpoint_writing():
                return super().save_checkpoint(out_dir, filename, *args)  # remote: as MMEngine
        part = osp.join(out_dir, f'.{filename}.part')
        main = is_main_process()  # MMEngine writes on the main process only; so do we
        try:
            with checkpoint_writing():  # host memory, which a device's budget does not count
                super().save_checkpoint(out_dir, osp.basename(part), *args)
            if main:
                move_into_place(part, osp.join(out_dir, filename))
        except BaseException as e:
            if main and osp.exists(part):
                with contextlib.suppress(OSError):  # a folder that refuses may refuse this too
                    os.remove(part)
            error = save_error(e, osp.join(out_dir, filename))  # a full or refusing disk
            if error is not None:  # one line: where, what it said, the previous checkpoint
                raise error from e
            raise

    def register_default_hooks(self, hooks: Optional[dict] = None) -> None:
        """MMEngine's default hooks, the checkpoint hook built as its
        :func:`~mmddp_ext.hooks.finite_checkpoint_hook.finite_checkpoint_type`
        (``FiniteCheckpointHook`` for ``CheckpointHook``): a refused save is never named in
        ``last_checkpoint`` and never becomes the best checkpoint. A hook given as an object is
        kept as it is (this method's ``save_checkpoint`` still refuses to write non-finite
        weights)."""
        hooks = our_default_hooks(hooks, self.cfg.get('custom_hooks'), warn=True)
        checkpoint = hooks.get('checkpoint', dict(type='CheckpointHook', interval=1))
        if isinstance(checkpoint, dict) and 'type' in checkpoint:
            checkpoint = dict(checkpoint, type=finite_checkpoint_type(checkpoint['type']))
        hooks['checkpoint'] = checkpoint
        super().register_default_hooks(hooks)

    def load_or_resume(self) -> None:
        """MMEngine's load or resume; an automatic resume (``--resume`` without a path) that
        finds no ``last_checkpoint`` in the work dir logs one line saying training starts
        from scratch, instead of MMEngine's "Did not find last_checkpoint" on every rank and
        "Auto resumed from the latest checkpoint None". Before that, with several ranks: the
        work dir's check and the starting checkpoint sent where missing
        (:func:`~mmddp_ext.runner.work_dir.share_work_dir`)."""
        if not self._has_loaded and self.world_size > 1:
            share_work_dir(self)
        if (not self._has_loaded and self.cfg.get('resume') and self.cfg.get('load_from') is None
                and not osp.exists(osp.join(self.work_dir, 'last_checkpoint'))):
            self.logger.info(f'[mmddp_ext] --resume: no checkpoint in {self.work_dir} yet: '
                             'starting from scratch')
            return None
        return super().load_or_resume()

    def build_log_processor(self, log_processor: Any) -> Any:
        """MMEngine's, with the training losses averaged over the ranks
        (:mod:`~mmddp_ext.global_loss.log_processor`) where the config asks for the stock one."""
        return super().build_log_processor(log_processor_cfg(log_processor))

    def build_logger(self, *args: Any, **kwargs: Any) -> Any:
        """MMEngine's logger, with the filter of known-harmless log warnings
        (:func:`~mmddp_ext.utils.quiet.quiet_logger`)."""
        return quiet_logger(super().build_logger(*args, **kwargs))

    @staticmethod
    def build_dataloader(dataloader: Any, seed: Optional[int] = None,
                         diff_rank_seed: bool = False) -> Any:
        """MMEngine's dataloader, its worker processes tied to this rank's life, handing their
        batches over through shared memory themselves
        (:mod:`~mmddp_ext.dataloader.shared_batches`)."""
        return share_batches(tie_workers(Runner.build_dataloader(dataloader, seed, diff_rank_seed)))

    def resume(self, filename: str, resume_optimizer: bool = True,
               resume_param_scheduler: bool = True, map_location='cpu') -> None:
        """MMEngine's resume, loading to CPU by default (no transient second copy of the
        weights and optimizer state on the GPU; tensors move to their parameters' device)."""
        return super().resume(filename, resume_optimizer, resume_param_scheduler, map_location)

    def setup_env(self, env_cfg: dict) -> None:
        """Filter known-harmless warnings (:func:`~mmddp_ext.utils.quiet.quiet_warnings`;
        ``Runner.__init__`` calls this first), initialise the process group ourselves (gloo
        on CPU, bounded rendezvous) when the entry point did not, then let MMEngine do the
        rest of its set-up."""
        quiet_warnings()
        if self.distributed:  # a DDPRunner constructed directly; from_cfg started it already
            for note in ensure_process_group(self.launcher, (env_cfg or {}).get('dist_cfg')):
                print_log(f'[mmddp_ext] {note}', logger='current')
        super().setup_env(env_cfg)
