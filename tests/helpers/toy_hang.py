"""A test-only script: MMEngine's toy runner with ``HangWatchdogHook`` whose training sleeps
in ``stuck_here`` at iteration 3, so that the watchdog has to end it.

    python -m tests.helpers.toy_hang WORK_DIR

The watchdog's automatic bound is used: ``max(MIN_TIMEOUT, FACTOR × the slowest iteration
timed)``, so it follows how fast this machine runs the toy iterations right now. Before an
iteration has been timed (iterations 1 and 2) the ``SLOW_TIMEOUT`` applies, so no healthy
iteration runs under the short bound; the 600 s sleep is far beyond either.
"""
import sys
import threading
import time

from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from mmengine.testing import RunnerTestCase

import mmddp_ext  # noqa: F401  (registers HangWatchdogHook)


@HOOKS.register_module()
class ToyStuckHook(Hook):

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if runner.iter == 2:
            stuck_here()


MIN_TIMEOUT = 10.0
FACTOR = 5.0
SLOW_TIMEOUT = 120.0


def stuck_here():
    time.sleep(600)


def idle_helper():
    """A second thread, so that the dump shows every thread, not only the main one."""
    time.sleep(600)


def main(work_dir: str) -> None:
    threading.Thread(target=idle_helper, name='idle_helper', daemon=True).start()
    case = RunnerTestCase()
    case.setUp()
    cfg = case.iter_based_cfg
    cfg.work_dir = work_dir
    cfg.train_cfg.max_iters = 10
    cfg.custom_hooks = [
        dict(type='HangWatchdogHook', min_timeout=MIN_TIMEOUT, factor=FACTOR,
             slow_timeout=SLOW_TIMEOUT),
        dict(type='ToyStuckHook')
    ]
    case.build_runner(cfg).train()


if __name__ == '__main__':
    main(sys.argv[1])
