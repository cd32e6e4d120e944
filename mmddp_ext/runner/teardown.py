"""The end of a run, in order (docs/internals.md, "Start-up and clean exit"): the data loaders of
the runner's loops are let go first, so their workers end by torch's own shutdown while the loader's
queues still work; then the entry drops the runner and collects it, with its hooks and DDP model,
while the process group is alive; then the group is destroyed.

The order matters: a runner lives in reference cycles, and a collection that finds its loader
finalizes the queues before the iterator asks its workers to stop, so each worker would wait
out torch's status interval before it is terminated.
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
