"""What dist_train.sh's front, ``tools/dist_train.py`` and the ranks agree on, defined once.

The shell scripts name some of them again (shell): ``tests/launch/test_shared.py`` holds
those copies equal to these.
"""
import signal

# EX_TEMPFAIL of sysexits.h: a temporary condition; running the command again continues. Every
# rank stopped on a signal after its checkpoint (PreemptionHook), and so did the job.
STOPPED_EXIT_CODE = 75

# the signals that ask a job to stop: PreemptionHook's defaults; the DataLoader workers leave
# them to their rank; the front sends them on to the workers
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

# set by the front once it sent a stop signal on: a worker that torchrun restarts
# (MAX_RESTARTS) after the stop inherits it, and tools/dist_train.py then exits with
# STOPPED_EXIT_CODE before training again
STOP_REQUESTED_ENV = 'MMDDP_STOP_REQUESTED'

# set by the front where the user's environment had no OMP_NUM_THREADS: the 1 torchrun sets is
# no choice, and each rank shares the node's cores instead (mmddp_ext.node.threads)
OMP_UNSET_ENV = 'MMDDP_OMP_UNSET'
