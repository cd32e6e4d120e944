"""A test-only script: MMEngine's toy runner with ``HangWatchdogHook`` whose training sleeps
in ``stuck_here`` at iteration 3, so that the watchdog has to end it.

    python -m tests.helpers.toy_hang WORK_DIR
"""
import sys
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


def stuck_here():
    time.sleep(600)


def main(work_dir: str) -> None:
    case = RunnerTestCase()
    case.setUp()
    cfg = case.iter_based_cfg
    cfg.work_dir = work_dir
    cfg.train_cfg.max_iters = 10
    cfg.custom_hooks = [
        dict(type='HangWatchdogHook', timeout=1.5, slow_timeout=30),
        dict(type='ToyStuckHook')
    ]
    case.build_runner(cfg).train()


if __name__ == '__main__':
    main(sys.argv[1])
