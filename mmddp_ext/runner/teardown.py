"""The end of a run, in order (docs/launching.md, "Clean exit"): the data loaders of the
runner's loops are let go first, so their DataLoader workers end by torch's own shutdown while
the loader's queues still work; then the entry drops the runner and collects it, with its
hooks and its DDP model, while the process group is alive; then the group is destroyed.

The order matters. A runner is held in reference cycles (its loops point back at it), so it is
freed by a garbage collection, and a collection finalizes the queues of a loader's iterator
(multiprocessing's finalizers are weak-reference callbacks, run first) before the iterator's
own shutdown asks its workers to stop: each worker then waits out torch's 5-second status
interval before it is terminated (measured: 10.4 s at the end of every rank of the demo, whose
validation loader keeps 2 persistent workers).
"""
from typing import Iterator

from mmengine.runner import BaseLoop


def built_loops(runner) -> Iterator[BaseLoop]:
    """The train, val and test loops the runner has built (none is built here)."""
    for loop in (runner._train_loop, runner._val_loop, runner._test_loop):
        if isinstance(loop, BaseLoop):
            yield loop


def let_go_of_loaders(runner) -> None:
    """Drop the built loops' data loaders and an iteration loop's open iterator over one; a
    loader nothing else holds is freed at once, and its workers (persistent ones, or an open
    iterator's) end with it. Only at the end of a run: the loops cannot run again."""
    for loop in built_loops(runner):
        if hasattr(loop, 'dataloader_iterator'):  # IterBasedTrainLoop's, ResumableIterLoop's
            loop.dataloader_iterator = None
        loop.dataloader = None
