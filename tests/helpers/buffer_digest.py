"""``BufferDigest``: before each validation epoch (after MMEngine's ``SyncBuffersHook`` ran at
the end of the training epoch), writes this rank's model buffers (BatchNorm running
statistics) to ``<out_dir>/rank<r>.json``."""
import json
import os
import os.path as osp

from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class BufferDigest(Hook):
    priority = 'LOW'  # after SyncBuffersHook (NORMAL)

    def __init__(self, out_dir: str):
        self.out_dir = out_dir

    def before_val_epoch(self, runner) -> None:
        os.makedirs(self.out_dir, exist_ok=True)
        buffers = {
            name: buf.double().sum().item()
            for name, buf in runner.model.named_buffers() if buf.is_floating_point()
        }
        with open(osp.join(self.out_dir, f'rank{runner.rank}.json'), 'w') as f:
            json.dump(buffers, f)
