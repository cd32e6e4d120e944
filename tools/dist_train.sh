#!/usr/bin/env bash
# Train CONFIG on GPUS processes per node with torchrun; on failure, print a diagnosis.
#
#   bash tools/dist_train.sh CONFIG GPUS [dist_train.py args...]
#
# Environment (as OpenMMLab's script):
#   NNODES       number of nodes (default 1)
#   NODE_RANK    this node's index (default 0)
#   MASTER_ADDR  host of node 0 (default 127.0.0.1; not used on a single node)
#   PORT         rendezvous port on node 0. Single node: everything listens on 127.0.0.1 only
#                (store, gloo, NCCL), on PORT or, unset, on a port the OS picks, so two jobs
#                on one machine never clash. Multi-node default: 29500 (the same on every node).
#   MAX_RESTARTS restarts of failed workers by torchrun (default 0); combine with --resume
#                so restarted workers continue from the latest checkpoint.
#   MMDDP_RENDEZVOUS_TIMEOUT    seconds a node waits for the others (default 300); node R > 0
#                first checks that it reaches MASTER_ADDR:PORT, and says what it waits for
#                every MMDDP_RENDEZVOUS_LOG_EVERY seconds (default 30)
#   MMDDP_LAUNCH_REPORT  where the JSON list of failed workers goes (default: a temporary
#                file, passed to the diagnosis and removed at exit)
#   GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME  single node: the loopback interface unless set
#   PYTHON       interpreter (default: the one tools/py picks)
# GPUS is processes per node: one per GPU; on a CPU-only host any number (gloo backend).
#
# torchrun runs inside mmddp_ext/launcher/torchrun_front.py, which checks before it starts (a
# port in use is named with the process holding it; an unreachable node 0 is named after the bound)
# and replaces torchrun's dump of a failed worker by one line plus the diagnosis.
# Exit codes: 0 done; 1 a worker failed (diagnosis printed); 2 nothing started (one line says
# why: bad arguments, port in use, node 0 unreachable, the other nodes did not join); 75 stopped
# by SIGTERM/SIGUSR1 after saving a checkpoint (PreemptionHook): --resume continues. A SIGTERM or
# SIGUSR1 to this script alone goes on to the ranks; the script waits while they save.
set -uo pipefail

if [ $# -lt 2 ]; then
  echo "usage: bash tools/dist_train.sh CONFIG GPUS [dist_train.py args...]" >&2
  exit 2
fi
CONFIG=$1
GPUS=$2
shift 2
MAX_RESTARTS=${MAX_RESTARTS:-0}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-$HERE/py}  # tools/py: $PYTHON, else the active venv, else .venv, else python(3)

for pair in "GPUS=$GPUS" "MAX_RESTARTS=$MAX_RESTARTS"; do
  value=${pair#*=}
  if ! [[ "$value" =~ ^[0-9]+$ ]] || { [ "${pair%%=*}" = GPUS ] && [ "$value" -lt 1 ]; }; then
    echo "dist_train.sh: ${pair%%=*}='$value' must be a whole number (GPUS at least 1)" >&2
    exit 2
  fi
done
if [[ "$CONFIG" != *::* ]] && [ ! -f "$CONFIG" ]; then
  echo "dist_train.sh: config file '$CONFIG' does not exist" >&2
  exit 2
fi

# The front (mmddp_ext/launcher/torchrun_front.py) completes and checks the layout (NNODES,
# NODE_RANK, MASTER_ADDR, PORT as given, a job operator's variables where they are unset: its
# mmddp_launch/kubeflow.py) and the rendezvous, then runs torchrun in-process.
# It writes the failed workers as JSON to MMDDP_LAUNCH_REPORT, which the diagnosis reads.
REPORT_DIR=$(mktemp -d "${TMPDIR:-/tmp}/mmddp_launch.XXXXXX") || exit 1
trap 'rm -rf "$REPORT_DIR"' EXIT
export MMDDP_LAUNCH_REPORT=${MMDDP_LAUNCH_REPORT:-$REPORT_DIR/launch_report.json}
rm -f "$MMDDP_LAUNCH_REPORT"  # a report left from an earlier run says nothing about this one

# A SIGTERM or SIGUSR1 to this script goes on to the front, which sends it to the workers and
# waits for them to save; this script waits too and exits with their code (75 after a save).
# shellcheck source=lib/forward_signals.sh
. "$HERE/lib/forward_signals.sh"
PYTHONPATH="$HERE/..${PYTHONPATH:+:$PYTHONPATH}" \
run_forwarding_stop_signals TERM \
"$PYTHON" "$HERE/../mmddp_ext/launcher/torchrun_front.py" --nnodes="${NNODES:-}" \
  --node-rank="${NODE_RANK:-}" --master-addr="${MASTER_ADDR:-}" --master-port="${PORT:-}" --nproc_per_node="$GPUS" \
  --max-restarts="$MAX_RESTARTS" "$HERE/dist_train.py" "$CONFIG" "$@"
rc=$?
if [ "$rc" != 0 ] && [ "$rc" != 2 ] && [ "$rc" != 75 ]; then  # 2, 75: the front's line says why
  REPORT_ARGS=()
  [ -s "$MMDDP_LAUNCH_REPORT" ] && REPORT_ARGS=(--launch-report "$MMDDP_LAUNCH_REPORT")
  PYTHONPATH="$HERE/..${PYTHONPATH:+:$PYTHONPATH}" \
    "$PYTHON" "$HERE/diagnose.py" ${REPORT_ARGS[@]+"${REPORT_ARGS[@]}"} --train-args "$CONFIG" "$@" || true
fi
exit "$rc"
