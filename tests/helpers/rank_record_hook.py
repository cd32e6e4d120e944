"""A test-only hook: every rank writes what it saw (its env and the samples it trained on)."""
import json
import os
import os.path as osp

from mmengine.dist import get_dist_info
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class RankRecordHook(Hook):
    """Writes ``<out_dir>/rank{R}.json`` after training.

    Args:
        out_dir: where the records go.
    """

    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir
        self.samples = []
        self.batch_sizes = []

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        self.batch_sizes.append(len(data_batch['data_samples']))
        for sample in data_batch['data_samples']:
            self.samples.append(int(sample.metainfo['id']))

    def after_train(self, runner) -> None:
        rank, world = get_dist_info()
        os.makedirs(self.out_dir, exist_ok=True)
        keys = ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'GROUP_RANK')
        model = runner.model.module if hasattr(runner.model, 'module') else runner.model
        checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
        record = dict(dist_rank=rank, dist_world=world, samples=self.samples,
                      batch_sizes=self.batch_sizes, param_checksum=checksum,
                      env={k: os.environ.get(k) for k in keys}, pid=os.getpid())
        with open(osp.join(self.out_dir, f'rank{rank}.json'), 'w') as f:
            json.dump(record, f)
