"""The ways a job is started, one module each, tried in the order of :data:`WAYS`: torchrun
(:mod:`.torchrun`), ranks started by hand (:mod:`.by_hand`), Slurm's srun (:mod:`.slurm`),
OpenMPI's mpirun (:mod:`.mpi`). ``mmddp_ext.launch()`` runs torchrun's agent; Kubeflow's
PyTorchJob runs ``dist_train.sh`` in each pod (:mod:`mmddp_launch.kubeflow`, read
by its front).

Each module holds everything about its way: ``NAME`` (MMEngine's ``launcher`` value),
``detect(environ)``, ``ask(environ)`` (what only the scheduler's own tools say), the pure
``to_torch(environ, asked)`` (its variables as torch's: ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_*``, ...) and ``task_cpus(environ)`` (the CPUs it gave this process,
named by ``TASK_CPUS_OF`` where it gives any); a scheduler that can put a stopped job back in its
queue also has ``requeue(environ)``.
Adding a scheduler is one module and one entry in :data:`WAYS`.
"""
from types import ModuleType
from typing import Mapping, Optional, Tuple

from . import by_hand, mpi, slurm, torchrun

WAYS: Tuple[ModuleType, ...] = (torchrun, by_hand, slurm, mpi)


def names() -> Tuple[str, ...]:
    """The ``launcher`` values: 'none' and each way's ``NAME``, once, in order."""
    return ('none', ) + tuple(dict.fromkeys(way.NAME for way in WAYS))


def detect(environ: Mapping[str, str]) -> Optional[ModuleType]:
    """The first way whose variables ``environ`` holds; None: a single process."""
    return next((way for way in WAYS if way.detect(environ)), None)


def named(name: str, environ: Mapping[str, str]) -> ModuleType:
    """The way for ``launcher=name``: the detected one when it has that name (torchrun's or by
    hand's 'pytorch'), else the first listed with it. ``KeyError`` for an unknown name."""
    found = detect(environ)
    if found is not None and found.NAME == name:
        return found
    for way in WAYS:
        if way.NAME == name:
            return way
    raise KeyError(name)


def requeue(environ: Mapping[str, str]) -> Optional[Tuple[bool, str]]:
    """Put this job back in its scheduler's queue: ``(requeued, what was done)`` from the first
    way whose ``requeue`` knows the job; None where none does (not a scheduler's job)."""
    for way in WAYS:
        done = getattr(way, 'requeue', lambda environ: None)(environ)
        if done is not None:
            return done
    return None
