"""Train an MMEngine config (MMPose, MMDetection, ...) on one process or many.

Usage, one scenario each::

    # 1 process (CPU, or one GPU)
    python tools/dist_train.py CONFIG [--work-dir DIR] [--resume [CHECKPOINT]] [--amp] \
        [--auto-scale-lr] [--cfg-options KEY=VALUE ...]

    # N processes on this machine (one per GPU; on a CPU any N, gloo backend)
    torchrun --nproc_per_node=N tools/dist_train.py CONFIG [ARGS]
    bash tools/dist_train.sh CONFIG N [ARGS]        # same, free port, diagnosis on failure

    # 2 nodes x N processes: run on each node with its NODE_RANK
    torchrun --nnodes=2 --node_rank=R --nproc_per_node=N --master_addr=HOST0 \
        --master_port=29500 tools/dist_train.py CONFIG [ARGS]

    # by hand, one process per GPU: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT per process
    RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 python tools/dist_train.py CONFIG

    # Slurm
    srun -N2 --ntasks-per-node=4 python tools/dist_train.py CONFIG --launcher slurm

    # the plan, without training: topology, batch, LR, schedule (no data, no GPU)
    python tools/dist_train.py CONFIG --explain [--world-size N] [--json] [--cfg-options ...]

    # ... and a memory forecast of every rank: a few real training steps of ONE process on
    # this machine's device (GPU, else CPU), fitted as fixed + per_sample x batch, plus DDP's
    # per-rank extras; the largest per-device batch for 1 process and for N
    python tools/dist_train.py CONFIG --explain --memory [--world-size N] \
        [--device-memory SIZE] [--json]

CONFIG is a file path or ``pkg::path`` of an installed OpenMMLab package, for example
``mmpose::body_2d_keypoint/topdown_heatmap/coco/td-hm_res50_8xb64-210e_coco-256x192.py``.
``--resume`` without a value resumes from the latest checkpoint in the work dir. Configs that
set ``runner_type`` are built with ``RUNNERS.build`` (MMPose's own train.py ignores it).

``--launcher`` defaults to ``pytorch`` when RANK or WORLD_SIZE is set, ``slurm`` inside a
multi-task srun step, else ``none``. A missing LOCAL_RANK is derived (see docs/launching.md).
Environment: MMDDP_RENDEZVOUS_TIMEOUT (seconds, default 300) bounds how long ranks started by
hand or by Slurm wait for each other. The process group is nccl with CUDA, gloo without
(``env_cfg.dist_cfg.backend`` overrides it, except nccl without a GPU).

``--device-memory`` (e.g. ``24GiB``, ``23.64GiB``, ``16000MiB``) is the memory per device to
plan for; default: the current GPU's total, on a CPU the RAM divided by the ranks of the node.
With ``--json`` the forecast is the ``memory`` object (``device_mib``, ``fixed_mib``,
``per_sample_mib``, ``ddp_extra_mib``, ``predicted_peak_mib``, ``max_batch_single``,
``max_batch_ddp``, ``method``, ``seconds``; see docs/memory.md). A size that is zero,
negative or not a size, or below what one process holds with no sample, is one line and
exit code 1.

Mistakes in the environment or arguments end with one line naming the variable, its value and
the fix, and exit code 1. A rank that raises writes ``<work_dir>/failures/rank{R}.json``;
``python -m mmddp_ext.diagnose WORK_DIR`` summarises them.
"""
import os
import sys
import warnings

# mmengine 0.10.7 still imports pkg_resources; its deprecation notice says nothing to our users.
warnings.filterwarnings('ignore', message='pkg_resources is deprecated')


def _pin_device_early() -> None:
    """Pin the CUDA device from LOCAL_RANK before the heavy imports touch CUDA."""
    local = os.environ.get('LOCAL_RANK') or os.environ.get('SLURM_LOCALID')
    if local is None or not local.isdigit():
        return  # derived or validated later, with a clear error
    # torch.cuda itself, not the package's GPU seam: importing the package imports MMEngine;
    # the package pins again through its seam (mmddp_ext.dist.launch.pin_device)
    import torch
    if torch.cuda.is_available() and int(local) < torch.cuda.device_count():
        torch.cuda.set_device(int(local))


if __name__ == '__main__':
    _pin_device_early()
    from mmddp_ext.entry.train import main
    sys.exit(main())
