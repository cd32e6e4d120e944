#!/usr/bin/env bash
# Train on a Slurm cluster (OpenMMLab's argument order):
#
#   [GPUS=8] [GPUS_PER_NODE=8] [CPUS_PER_TASK=5] [GRES=...] [SRUN_ARGS=...] \
#     bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [dist_train.py args...]
#
# GPUS tasks in all, GPUS_PER_NODE per node (one per GPU; on CPU nodes any number). Each task
# runs tools/dist_train.py --launcher slurm, which maps SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID/
# SLURM_NODEID onto RANK/WORLD_SIZE/LOCAL_RANK/node rank and takes MASTER_ADDR from Slurm's
# address of the first node (its NodeAddr; see docs/launching.md).
# GRES: unset, --gres=gpu:GPUS_PER_NODE is asked only where the partition has GPUs configured as
# GRES (sinfo -p PARTITION -o %G says gpu); elsewhere Slurm would refuse it ("Invalid generic
# resource (gres) specification"). GRES=gpu:a100:4 asks that instead; GRES=none asks nothing.
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

for pair in "GPUS=$GPUS" "GPUS_PER_NODE=$GPUS_PER_NODE" "CPUS_PER_TASK=$CPUS_PER_TASK"; do
  if ! [[ "${pair#*=}" =~ ^[1-9][0-9]*$ ]]; then
    echo "slurm_train.sh: ${pair%%=*}='${pair#*=}' must be a whole number, at least 1" >&2
    exit 2
  fi
done
if [ -z "${GRES+set}" ]; then  # ask for GPUs only where the partition has them as GRES
  if sinfo -h -p "$PARTITION" -o %G 2>/dev/null | grep -q gpu; then
    GRES=gpu:$GPUS_PER_NODE
  else
    GRES=none
    echo "slurm_train.sh: partition '$PARTITION' has no GPUs configured as GRES (sinfo -o %G):" \
      "no --gres asked; $GPUS_PER_NODE task(s) per node" >&2
  fi
fi
GRES_ARGS=()
if [ -n "$GRES" ] && [ "$GRES" != none ]; then GRES_ARGS=(--gres="$GRES"); fi

# A SIGUSR1 to this script goes on to srun, which sends it to the ranks; a SIGTERM goes on as
# SIGUSR1 (srun ends its tasks at once on SIGTERM: "srun: forcing job termination"). The script
# waits while the ranks save and exits with srun's code (75 after a save).
# shellcheck source=lib/forward_signals.sh
. "$HERE/lib/forward_signals.sh"
# shellcheck disable=SC2086
PYTHONPATH="$HERE/..${PYTHONPATH:+:$PYTHONPATH}" \
run_forwarding_stop_signals USR1 srun -p "$PARTITION" --job-name="$JOB_NAME" ${GRES_ARGS[@]+"${GRES_ARGS[@]}"} \
  --ntasks="$GPUS" --ntasks-per-node="$GPUS_PER_NODE" --cpus-per-task="$CPUS_PER_TASK" \
  --kill-on-bad-exit=1 $SRUN_ARGS \
  "$PYTHON" -u "$HERE/dist_train.py" "$CONFIG" --work-dir="$WORK_DIR" --launcher slurm "$@"
