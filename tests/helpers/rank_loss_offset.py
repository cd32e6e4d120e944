"""``RankLossOffset``: makes the ranks' logged total losses differ by construction (rank r's
``loss`` is raised by ``r * offset`` before MMEngine records it) and writes each rank's
recorded values per iteration to ``<out_dir>/rank<r>.jsonl``."""
import json
import os
import os.path as osp

from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class RankLossOffset(Hook):
    priority = 'HIGHEST'  # before RuntimeInfoHook records the outputs

    def __init__(self, out_dir: str, offset: float = 10.0):
        self.out_dir, self.offset = out_dir, offset

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        outputs['loss'] = outputs['loss'] + runner.rank * self.offset
        os.makedirs(self.out_dir, exist_ok=True)
        with open(osp.join(self.out_dir, f'rank{runner.rank}.jsonl'), 'a') as f:
            f.write(json.dumps({k: float(v) for k, v in outputs.items()}) + '\n')
