"""The garbage collector around a training process's start-up and exit.

Start-up imports torch, MMEngine and the model's codebase (MMPose's registry modules pull in
scipy, matplotlib, torchvision): about half a million objects that live as long as the process.
With the collector on, each full collection while they are created scans all of them again:
a fifth of the start-up's CPU time (the demo rank's imports: 4.0 CPU-s, 3.2 with the collector
off). MMEngine then collects twice per dataset it builds (``_serialize_data``), about 0.2 s each
over that heap, and at exit the interpreter's own collections walk it once more while modules
are torn down.

``tools/dist_train.py`` therefore turns the collector off before its first import, and the entry
calls :func:`settle_start_up` once the runner is built, in a process of ours only
(:mod:`mmddp_ext.utils.process_state`: a caller's objects are never frozen): one collection
(the start-up's own garbage is freed, not kept), then ``gc.freeze()`` moves what survived out
of the collector's view, and the collector is turned on for training. Python's documentation
describes the same pattern (``gc.disable()`` early, ``gc.freeze()`` once the long-lived objects
exist); it also keeps forked data-loader workers from writing to those objects' pages.

What is frozen is never collected, at exit neither. The runner (in reference cycles through its
loops and hooks) and its DDP model are frozen with the start-up, so the end of a run frees them
itself, in order (:func:`release_run`, called by the entry while the process group is still
alive; docs/launching.md, "Clean exit"): before this, gloo could abort at interpreter exit
when the interpreter destroyed them there, in whatever order its last collections found them.
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
