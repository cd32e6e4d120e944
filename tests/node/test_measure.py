"""node/measure on the demo's own data and model: one batch's tensor bytes (the same as a batch
loaded here without workers), a real worker's own memory, the BatchNorm layers that train; and
what it says where the data is not there."""
import copy

import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmengine.runner import Runner
from mmengine.structures import InstanceData

from mmddp_ext.node.measure import measure_loading, tensor_bytes, training_batchnorms

from conftest import DEMO_CONFIG


def _demo(data_root: str, workers: int = 2) -> Config:
    cfg = Config.fromfile(DEMO_CONFIG)
    root = data_root.rstrip('/') + '/'
    cfg.train_dataloader.dataset.data_root = root
    cfg.train_dataloader.num_workers = workers
    return cfg


def test_tensor_bytes_walks_containers_and_data_elements():
    element = InstanceData(
        keypoints=torch.zeros(2, 17, 2), labels=torch.zeros(2, dtype=torch.int64))
    data = {'inputs': [torch.zeros(3, 8, 8, dtype=torch.uint8)] * 2, 'data_samples': [element]}
    assert tensor_bytes(data) == 2 * 3 * 8 * 8 + 2 * 17 * 2 * 4 + 2 * 8
    assert tensor_bytes(('text', 3, None)) == 0


def test_the_demos_batch_bytes_and_a_workers_own_memory(demo_data):
    cfg = _demo(demo_data)
    sample = measure_loading(cfg, batch=8)
    assert sample.not_measured == ''
    # the same batch size loaded here without workers: the same tensor bytes
    loader_cfg = copy.deepcopy(cfg.train_dataloader)
    loader_cfg.update(batch_size=8, num_workers=0, persistent_workers=False)
    init_default_scope('mmpose')
    expected = tensor_bytes(next(iter(Runner.build_dataloader(loader_cfg))))
    assert sample.batch_bytes == expected > 0
    assert 0 < sample.worker_bytes < sample.process_bytes


def test_no_worker_is_measured_where_the_config_has_none(demo_data):
    sample = measure_loading(_demo(demo_data, workers=0), batch=4)
    assert sample.batch_bytes > 0 and sample.worker_bytes is None


def test_missing_data_is_named_instead_of_a_number(tmp_path):
    sample = measure_loading(_demo(str(tmp_path / 'nowhere')), batch=4)
    assert sample.batch_bytes is None and 'could not be loaded here' in sample.not_measured


def test_batchnorms_that_train_frozen_ones_do_not_count():
    cfg = Config.fromfile(DEMO_CONFIG)
    training = training_batchnorms(cfg)
    assert training > 0
    cfg.model.backbone.norm_eval = True  # ResNet keeps its BatchNorms in eval mode
    assert 0 <= training_batchnorms(cfg) < training
    cfg.model.backbone.type = 'NoSuchBackbone'
    assert training_batchnorms(cfg) is None
