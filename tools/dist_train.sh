#!/usr/bin/env bash
# Train CONFIG on GPUS processes per node with torchrun; on failure, print a diagnosis.
#
#   bash tools/dist_train.sh CONFIG GPUS [dist_train.py args...]
#
# Environment (as OpenMMLab's script):
#   NNODES       number of nodes (default 1)
#   NODE_RANK    this node's index (default 0)
#   MASTER_ADDR  host of node 0 (default 127.0.0.1)
#   PORT         rendezvous port on node 0. Single node without PORT: the store listens on
#                127.0.0.1 only, on a port the OS picks, so two jobs on one machine never
#                clash. Multi-node default: 29500 (must be the same on every node).
#   MAX_RESTARTS restarts of failed workers by torchrun (default 0); combine with --resume
#                so restarted workers continue from the latest checkpoint.
#   PYTHON       interpreter (default: the one tools/py picks)
# GPUS is processes per node: one per GPU; on a CPU-only host any number (gloo backend).
set -uo pipefail

if [ $# -lt 2 ]; then
  echo "usage: bash tools/dist_train.sh CONFIG GPUS [dist_train.py args...]" >&2
  exit 2
fi
CONFIG=$1
GPUS=$2
shift 2
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MAX_RESTARTS=${MAX_RESTARTS:-0}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-$HERE/py}  # tools/py: $PYTHON, else the active venv, else .venv, else python(3)

for pair in "GPUS=$GPUS" "NNODES=$NNODES" "MAX_RESTARTS=$MAX_RESTARTS" "NODE_RANK=$NODE_RANK"; do
  value=${pair#*=}
  if ! [[ "$value" =~ ^[0-9]+$ ]] || { [ "${pair%%=*}" != MAX_RESTARTS ] && [ "${pair%%=*}" != NODE_RANK ] && [ "$value" -lt 1 ]; }; then
    echo "dist_train.sh: ${pair%%=*}='$value' must be a whole number (GPUS and NNODES at least 1)" >&2
    exit 2
  fi
done
if [ "$NODE_RANK" -ge "$NNODES" ]; then
  echo "dist_train.sh: NODE_RANK=$NODE_RANK is out of range for NNODES=$NNODES (0..$((NNODES - 1)))" >&2
  exit 2
fi
if [[ "$CONFIG" != *::* ]] && [ ! -f "$CONFIG" ]; then
  echo "dist_train.sh: config file '$CONFIG' does not exist" >&2
  exit 2
fi

if [ "$NNODES" = 1 ] && [ -z "${PORT:-}" ]; then
  # torchrun, with its store on 127.0.0.1 and a port the OS picks (loopback only, no clash)
  LAUNCH=("$HERE/../mmddp_ext/dist/loopback_run.py")
else
  LAUNCH=(-m torch.distributed.run --nnodes="$NNODES" --node_rank="$NODE_RANK"
          --master_addr="$MASTER_ADDR" --master_port="${PORT:-29500}")
fi

PYTHONPATH="$HERE/..${PYTHONPATH:+:$PYTHONPATH}" \
"$PYTHON" "${LAUNCH[@]}" --nproc_per_node="$GPUS" \
  --max-restarts="$MAX_RESTARTS" "$HERE/dist_train.py" "$CONFIG" "$@"
rc=$?
if [ "$rc" != 0 ]; then
  PYTHONPATH="$HERE/..${PYTHONPATH:+:$PYTHONPATH}" \
    "$PYTHON" -m mmddp_ext.diagnose --train-args "$CONFIG" "$@" || true
fi
exit "$rc"
