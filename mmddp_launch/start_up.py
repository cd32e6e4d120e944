"""The garbage collector around a training process's start-up and exit.

Start-up creates about half a million long-lived objects (torch, MMEngine, the codebase), and
every full collection meanwhile scans them again. ``tools/dist_train.py`` turns the collector
off before its first import; once the runner is built the entry calls :func:`settle_start_up`
(a process of ours only, :mod:`mmddp_ext.utils.process_state`): one collection, then
``gc.freeze()``, as Python's documentation recommends; this also keeps forked DataLoader
workers from writing to those objects' pages. What is frozen is never collected, so the end of a
run frees the runner and its DDP model itself, while the process group is alive
(:func:`release_run`; docs/internals.md, "Start-up and clean exit"). Figures: docs/benchmarks.md.
"""
import gc


def settle_start_up() -> None:
    """Collect the start-up's garbage once, freeze what survived, and turn the collector on
    (from here on, collections scan only what training creates)."""
    gc.collect()
    gc.freeze()
    gc.enable()


def collect_all() -> None:
    """Return the frozen objects to the collector and collect: a runner dropped since the
    start-up is freed, with its model. Between two runs in one process, not at exit."""
    gc.unfreeze()
    gc.collect()


def release_run(owned: bool) -> None:
    """Free what a finished run dropped (its runner, with the loops, hooks, data-loader workers
    and DDP model): call it after the last reference is gone and before the process group is
    destroyed. In a process of ours (``owned``) the frozen objects go back to the collector for
    one collection and what survives is frozen again, so the interpreter's exit still skips the
    start-up's heap; in a caller's process one collection, its freeze left alone."""
    if owned:
        collect_all()
        gc.freeze()
    else:
        gc.collect()
