"""The private names of MMEngine (0.10.7) that mmddp_ext still uses, each with where and why no
public way exists. Everything else extends MMEngine through its registries and subclasses.

``tests/utils/test_mmengine_private.py`` checks every entry against the installed MMEngine, so
a release that renames or removes one fails there first, by name, instead of somewhere in a
training run. A new use of a private MMEngine name belongs in this list.
"""
from typing import NamedTuple, Tuple


class PrivateName(NamedTuple):
    """One private MMEngine name: ``owner`` (``module:Class``), ``name``, whether it is a
    method or class attribute (``'class'``) or set in ``__init__`` (``'instance'``), the
    module that uses it, and why no public way exists."""

    owner: str
    name: str
    kind: str
    used_in: str
    why: str


PRIVATE_NAMES: Tuple[PrivateName, ...] = (
    PrivateName(
        'mmengine.runner:Runner', 'from_cfg', 'class', 'runner/runner_type.py',
        'the deliberate exception: MMPose\'s tools/train.py calls Runner.from_cfg, which builds '
        'a stock Runner whatever runner_type says; extending that classmethod (public, but '
        'replaced on the class) is the only way a config can choose DDPRunner there'),
    PrivateName(
        'mmengine.runner:Runner', '_has_loaded', 'instance', 'runner/ddp_runner.py',
        'load_or_resume must know whether a checkpoint was loaded already; MMEngine keeps that '
        'flag only here'),
    PrivateName(
        'mmengine.runner.loops:EpochBasedTrainLoop', '_epoch', 'instance',
        'runner/resumable_loop.py',
        'resuming mid-epoch re-implements run() and run_epoch(); the public epoch property '
        'is read-only'),
    PrivateName('mmengine.runner.loops:EpochBasedTrainLoop', '_iter', 'instance',
                'runner/resumable_loop.py', 'as _epoch: the public iter property is read-only'),
    PrivateName('mmengine.runner.loops:EpochBasedTrainLoop', '_max_epochs', 'instance',
                'runner/resumable_loop.py', 'read in the re-implemented run(), as MMEngine does'),
    PrivateName(
        'mmengine.runner.loops:EpochBasedTrainLoop', '_decide_current_val_interval', 'class',
        'runner/resumable_loop.py',
        'the re-implemented run() must honour dynamic_intervals exactly as MMEngine\'s does'),
    PrivateName(
        'mmengine.runner.loops:IterBasedTrainLoop', '_iter', 'instance',
        'runner/resumable_iter_loop.py',
        'resuming at the sampler re-implements __init__ (without starting the loader) and run(); '
        'the public iter property is read-only'),
    PrivateName('mmengine.runner.loops:IterBasedTrainLoop', '_max_iters', 'instance',
                'runner/resumable_iter_loop.py',
                'set and read as MMEngine\'s own __init__ and run()'),
    PrivateName('mmengine.runner.loops:IterBasedTrainLoop', '_max_epochs', 'instance',
                'runner/resumable_iter_loop.py', 'set as MMEngine\'s own __init__ sets it'),
    PrivateName('mmengine.runner.loops:IterBasedTrainLoop', '_epoch', 'instance',
                'runner/resumable_iter_loop.py', 'set as MMEngine\'s own __init__ sets it'),
    PrivateName(
        'mmengine.runner.loops:IterBasedTrainLoop', '_decide_current_val_interval', 'class',
        'runner/resumable_iter_loop.py',
        'the re-implemented run() must honour dynamic_intervals exactly as MMEngine\'s does'),
    PrivateName(
        'mmengine.dataset.sampler:InfiniteSampler', '_indices_of_rank', 'class',
        'runner/resumable_iter_loop.py',
        'a pass that starts at the beginning of the rank\'s stream: InfiniteSampler makes one '
        'stream when it is built and has no public way to start it again'),
    PrivateName(
        'mmengine.optim:OptimWrapper', '_inner_count', 'instance', 'ddp/microbatch.py',
        'micro-batches of one step must count as one accumulation step; OptimWrapper exposes '
        'the counter only through initialize_count_status, which also resets max_counts'),
    PrivateName(
        'mmengine.hooks:CheckpointHook', '_save_checkpoint_with_step', 'class',
        'hooks/finite_checkpoint_hook.py',
        'overridden by FiniteCheckpointHook (registered): a save with non-finite '
        'weights is refused before CheckpointHook removes old checkpoints or records '
        'last_checkpoint; the hook has no public step in between'),
    PrivateName(
        'mmengine.hooks:CheckpointHook', '_save_best_checkpoint', 'class',
        'hooks/finite_checkpoint_hook.py',
        'overridden as _save_checkpoint_with_step: a refused save must never become '
        'the best one'),
    PrivateName(
        'mmengine.logging:HistoryBuffer', '_statistics_methods', 'class', 'checkpoint/loader.py',
        'the safe checkpoint loader allows exactly the registered statistics methods; '
        'HistoryBuffer has no public list of them'),
    PrivateName(
        'mmengine.runner:Runner', '_train_loop', 'instance', 'runner/teardown.py',
        'the end of a run reaches the train loop only if it was built: the public train_loop '
        'property builds it (and its data loader) when it was not'),
    PrivateName(
        'mmengine.runner:Runner', '_val_loop', 'instance', 'runner/teardown.py',
        'the end of a run reaches the val loop only if it was built: the public val_loop '
        'property builds it (and its data loader) when it was not'),
    PrivateName(
        'mmengine.runner:Runner', '_test_loop', 'instance', 'runner/teardown.py',
        'the end of a run reaches the test loop only if it was built: the public test_loop '
        'property builds it (and its data loader) when it was not'),
    PrivateName(
        'mmengine.runner:loops', '_InfiniteDataloaderIterator', 'class',
        'runner/resumable_iter_loop.py',
        'ResumedBatches subclasses it, so that an iteration loop\'s dataloader_iterator keeps '
        'MMEngine\'s type; MMEngine has no public iterator class there'),
    PrivateName('mmengine.runner.loops:_InfiniteDataloaderIterator', '_dataloader', 'instance',
                'runner/resumable_iter_loop.py',
                'ResumedBatches keeps the attributes of the class it subclasses: the loader'),
    PrivateName(
        'mmengine.runner.loops:_InfiniteDataloaderIterator', '_iterator', 'instance',
        'runner/resumable_iter_loop.py',
        'ResumedBatches keeps the attributes of the class it subclasses: the open iterator'),
    PrivateName(
        'mmengine.runner:LogProcessor', '_collect_scalars', 'class', 'global_loss/log_processor.py',
        'overridden by the registered subclass GlobalLossLogProcessor: the one step where the '
        'values of a log line are made, before both the text line and the visualizer\'s scalars '
        'are built from them'),
)
