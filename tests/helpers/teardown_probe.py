"""``ModelTeardownProbe``: notes, per rank, when the runner's model (the DDP wrapper) is
destroyed: whether the process group was still alive then, and which of the rank's
DataLoader workers alive after training still ran (the ordered teardown of
:mod:`mmddp_ext.entry.train`). Nothing is written when the model is never destroyed."""
import json
import os
import os.path as osp
import weakref

import psutil
import torch.distributed as dist
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


def _note(path: str, workers: list) -> None:
    running = [
        p for p in workers if psutil.pid_exists(p) and psutil.Process(p).status() != 'zombie'
    ]
    with open(path, 'w') as f:
        json.dump(
            dict(group_alive=dist.is_available() and dist.is_initialized(), workers=len(workers),
                 workers_running=len(running)), f)


@HOOKS.register_module()
class ModelTeardownProbe(Hook):

    def __init__(self, out_dir: str):
        self.out_dir = out_dir
        self.workers = []  # filled after training, read when the model is destroyed

    def before_train(self, runner) -> None:
        os.makedirs(self.out_dir, exist_ok=True)
        rank = dist.get_rank() if dist.is_initialized() else 0
        finalizer = weakref.finalize(runner.model, _note,
                                     osp.join(self.out_dir, f'rank{rank}.json'), self.workers)
        finalizer.atexit = False  # a model still alive at exit is not noted

    def after_train(self, runner) -> None:
        # torch names its workers' processes so (the rank's other child copies its stderr)
        self.workers += [c.pid for c in psutil.Process().children() if c.name() == 'pt_data_worker']
