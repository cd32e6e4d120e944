#!/usr/bin/env bash
# Train on a Slurm cluster (OpenMMLab's argument order):
#
#   [GPUS=8] [GPUS_PER_NODE=8] [CPUS_PER_TASK=5] [SRUN_ARGS=...] \
#     bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [dist_train.py args...]
#
# One task per GPU; each task runs tools/dist_train.py --launcher slurm, which maps
# SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID/SLURM_NODEID onto RANK/WORLD_SIZE/LOCAL_RANK/node rank
# and takes MASTER_ADDR from the first host of SLURM_NODELIST (see docs/launching.md).
set -euo pipefail

if [ $# -lt 4 ]; then
  echo "usage: bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [args...]" >&2
  exit 2
fi
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
WORK_DIR=$4
shift 4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
SRUN_ARGS=${SRUN_ARGS:-}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-$HERE/py}  # tools/py: $PYTHON, else the active venv, else .venv, else python(3)

# shellcheck disable=SC2086
PYTHONPATH="$HERE/..${PYTHONPATH:+:$PYTHONPATH}" \
srun -p "$PARTITION" --job-name="$JOB_NAME" --gres=gpu:"$GPUS_PER_NODE" \
  --ntasks="$GPUS" --ntasks-per-node="$GPUS_PER_NODE" --cpus-per-task="$CPUS_PER_TASK" \
  --kill-on-bad-exit=1 $SRUN_ARGS \
  "$PYTHON" -u "$HERE/dist_train.py" "$CONFIG" --work-dir="$WORK_DIR" --launcher slurm "$@"
