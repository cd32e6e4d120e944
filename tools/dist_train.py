"""Train an MMEngine config (MMPose, MMDetection, ...) on one process or many.

``python tools/dist_train.py --help`` lists the flags; docs/launching.md shows the six ways to
start it (``dist_train.sh``, torchrun, by hand, Slurm, from Python, mpirun) and what each
prints, docs/scaling.md ``--explain``, docs/memory.md ``--explain --memory``. The entry itself
is :mod:`mmddp_ext.entry.train`; this script only pins the GPU before the heavy imports.
"""
import gc
import os
import sys
import warnings

from mmddp_launch.shared import STOP_REQUESTED_ENV, STOPPED_EXIT_CODE

# mmengine 0.10.7 still imports pkg_resources; its deprecation notice says nothing to our users.
warnings.filterwarnings('ignore', message='pkg_resources is deprecated')


def early_local_rank(environ) -> 'int | None':
    """The local rank a launcher gave this process, before the package can be imported (it
    imports MMEngine and the model code): torchrun's, Slurm's or OpenMPI's variable, whichever
    is set; None where it is missing or not a number (the package derives or refuses it).
    The package's one reader of the layout (mmddp_ext.launcher.layout) then reads the same
    local rank: tests/launcher/test_layout.py keeps the two equal for every launcher."""
    local = (
        environ.get('LOCAL_RANK') or environ.get('SLURM_LOCALID')
        or environ.get('OMPI_COMM_WORLD_LOCAL_RANK'))
    return int(local) if local is not None and local.isdigit() else None


def _pin_device_early() -> None:
    """Pin the CUDA device from the local rank before the heavy imports touch CUDA."""
    local = early_local_rank(os.environ)
    if local is None:
        return  # derived or validated later, with a clear error
    # torch.cuda itself, not the package's GPU seam: importing the package imports MMEngine;
    # the package pins again through its seam (mmddp_ext.ddp.process_group.pin_device)
    import torch
    if torch.cuda.is_available() and local < torch.cuda.device_count():
        torch.cuda.set_device(local)


def _stopped_before_this_restart() -> bool:
    """torchrun restarted this worker (MAX_RESTARTS) after dist_train.sh's front sent the job a
    stop signal (``STOP_REQUESTED_ENV``, mmddp_launch/shared.py): the job was asked to stop and
    its checkpoint is saved, so this worker does not train again."""
    name = os.environ.get(STOP_REQUESTED_ENV)
    if not name or os.environ.get('TORCHELASTIC_RESTART_COUNT', '0') == '0':
        return False
    print(
        f'[mmddp_ext] rank {os.environ.get("RANK", "?")}: not started again: the job was '
        f'stopped by {name} (exit code {STOPPED_EXIT_CODE}: --resume continues)', file=sys.stderr)
    return True


if __name__ == '__main__':
    if _stopped_before_this_restart():
        sys.exit(STOPPED_EXIT_CODE)
    # no garbage collection while start-up imports half a million long-lived objects: the
    # entry collects once and turns it on when the runner is built (mmddp_launch.start_up)
    gc.disable()
    _pin_device_early()
    from mmddp_ext.entry.train import main
    from mmddp_ext.utils.process_state import own_process
    own_process()  # its process-wide settings are the run's (mmddp_ext.utils.process_state)
    sys.exit(main())
