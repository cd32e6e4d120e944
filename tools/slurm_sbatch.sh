#!/usr/bin/env bash
# A Slurm batch job that trains CONFIG across nodes, stops cleanly when told to, and continues:
#
#   sbatch [-p PARTITION] [-N 2] [--ntasks-per-node=4] [--gres=gpu:4] \
#     tools/slurm_sbatch.sh CONFIG WORK_DIR [dist_train.py args...]
#
# Submit it from the repository root (the job runs there: $SLURM_SUBMIT_DIR). The #SBATCH lines
# below are defaults; options on the sbatch command line win. One task per GPU; on CPU nodes
# any number of tasks per node.
#
# Stop and continue: Slurm sends SIGUSR1 90 s before the time limit (--signal=USR1@90), and
# `scancel --signal=USR1 JOB` sends it at any time. Every rank then finishes its iteration, one
# checkpoint is saved, and, as the job was submitted with --requeue, it requeues itself
# (scontrol requeue); started again, it resumes from that checkpoint (--resume) at the next
# iteration. Its output is appended to the same file (--open-mode=append).
#SBATCH --job-name=mmddp_train
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=1
#SBATCH --requeue
#SBATCH --signal=USR1@90
#SBATCH --open-mode=append
#SBATCH --output=slurm-%x-%j.out
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: sbatch tools/slurm_sbatch.sh CONFIG WORK_DIR [dist_train.py args...]" >&2
  exit 2
fi
CONFIG=$1
WORK_DIR=$2
shift 2
cd "${SLURM_SUBMIT_DIR:-.}"
echo "[slurm_sbatch] job ${SLURM_JOB_ID:-?} start ${SLURM_RESTART_COUNT:-0} on ${SLURM_JOB_NODELIST:-?}"

# `scancel --signal=USR1 --full` signals this script too (`--signal=B:USR1@90`: this script
# alone): it sends the signal on to srun, which sends it to the ranks, and waits while they
# save; a script that died of it would end the job's steps under them. A SIGTERM to this script
# alone (`--signal=B:TERM@90`) goes on as SIGUSR1: srun ends its tasks at once when it gets a
# SIGTERM itself ("srun: forcing job termination"), as with `scancel --signal=TERM --full`.
# shellcheck source=lib/forward_signals.sh
. tools/lib/forward_signals.sh
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" \
run_forwarding_stop_signals USR1 \
  srun --kill-on-bad-exit=1 tools/py -u tools/dist_train.py "$CONFIG" --work-dir="$WORK_DIR" \
  --launcher slurm --resume "$@"
