# Sourced by the launcher scripts. run_forwarding_stop_signals TERM_AS CMD [ARGS...] runs CMD in
# the background and waits for it; a SIGUSR1 that reaches the script (alone, or with every process
# of the job: `kill -- -PGID`, `scancel --signal=USR1 --full`) is sent on to CMD, a SIGTERM (a
# container stop, `sbatch --signal=B:TERM@T`) as TERM_AS, and the script goes on waiting while
# the ranks save. Ctrl-C reaches CMD from the terminal itself; the script waits for it. Returns
# CMD's exit status (75: stopped after saving); works under `set -e`.
run_forwarding_stop_signals() {
  _MMDDP_TERM_AS=$1
  shift
  if { true <&0; } 2>/dev/null; then
    "$@" <&0 &  # the script's own stdin (bash gives a background command /dev/null)
  else
    "$@" </dev/null &  # started with stdin closed
  fi
  _MMDDP_CHILD=$!
  trap 'kill -s "$_MMDDP_TERM_AS" "$_MMDDP_CHILD" 2>/dev/null || true' TERM
  trap 'kill -s USR1 "$_MMDDP_CHILD" 2>/dev/null || true' USR1
  trap ':' INT
  local rc
  while :; do
    rc=0
    wait "$_MMDDP_CHILD" || rc=$?
    kill -0 "$_MMDDP_CHILD" 2>/dev/null || break  # gone: rc is its status; else a signal came
  done
  trap - TERM USR1 INT
  return "$rc"
}
