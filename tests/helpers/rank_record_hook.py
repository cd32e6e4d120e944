"""A test-only hook: every rank writes what it saw (its env, the samples it trained on, its
batch sizes) and what it ended with (a checksum and a digest of its parameters)."""
import gc
import hashlib
import json
import os
import os.path as osp

import psutil
import torch
from mmengine.dist import get_dist_info
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


def _params(runner):
    model = runner.model.module if hasattr(runner.model, 'module') else runner.model
    return [p.detach().cpu() for p in model.parameters()]


def param_checksum(params) -> float:
    """The sum of every parameter, in float64."""
    return float(sum(p.sum(dtype=torch.float64) for p in params))


def param_digest(params) -> str:
    """SHA-256 of the parameters' bytes, in order: equal only for bitwise-equal replicas."""
    h = hashlib.sha256()
    for p in params:
        h.update(p.contiguous().numpy())  # the buffer itself: no copy
    return h.hexdigest()


@HOOKS.register_module()
class RankRecordHook(Hook):
    """Writes ``<out_dir>/rank{R}.json`` after training.

    The record: ``dist_rank``, ``dist_world``, ``samples`` (``metainfo['id']`` of every
    trained sample, in order), ``img_ids`` (``metainfo['img_id']``, where present),
    ``batch_sizes`` (one per iteration), ``param_checksum`` / ``param_digest`` after training,
    ``param_checksum_before`` / ``param_digest_before`` before the first iteration, the
    launcher's ``env``, the ``pid``, ``num_workers`` of the train loader and ``live_workers``
    (this process's child processes when training ended: persistent workers), and ``gc``:
    whether the garbage collector was on when training began and whether the runner (built at
    start-up) was out of its view (frozen).

    Args:
        out_dir: where the records go.
    """

    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir
        self.samples = []
        self.img_ids = []
        self.batch_sizes = []
        self.before = None
        self.gc = None

    def before_train(self, runner) -> None:
        params = _params(runner)
        self.before = (param_checksum(params), param_digest(params))
        self.gc = dict(enabled=gc.isenabled(),
                       runner_frozen=not any(o is runner for o in gc.get_objects()))

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        self.batch_sizes.append(len(data_batch['data_samples']))
        for sample in data_batch['data_samples']:
            self.samples.append(int(sample.metainfo['id']))
            if 'img_id' in sample.metainfo:
                self.img_ids.append(int(sample.metainfo['img_id']))

    def after_train(self, runner) -> None:
        rank, world = get_dist_info()
        os.makedirs(self.out_dir, exist_ok=True)
        keys = ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'GROUP_RANK',
                'TORCHELASTIC_RESTART_COUNT')
        params = _params(runner)
        before = self.before or (None, None)
        record = dict(dist_rank=rank, dist_world=world, samples=self.samples, img_ids=self.img_ids,
                      batch_sizes=self.batch_sizes, param_checksum=param_checksum(params),
                      param_digest=param_digest(params), param_checksum_before=before[0],
                      param_digest_before=before[1], env={k: os.environ.get(k)
                                                          for k in keys}, pid=os.getpid(),
                      threads=torch.get_num_threads(), gc=self.gc,
                      num_workers=runner.train_dataloader.num_workers,
                      live_workers=len(psutil.Process().children()))
        with open(osp.join(self.out_dir, f'rank{rank}.json'), 'w') as f:
            json.dump(record, f)
