"""entry/node_report: the threads a rank computes with, and the node section of --explain on the
demo's own data (its 2 workers), as JSON and as lines."""
import pytest
from mmengine.config import Config

from mmddp_ext.entry.node_report import node_report, render_node, threads_per_rank

from conftest import DEMO_CONFIG


@pytest.mark.parametrize(
    'environ,world,expected',
    [
        ({
            'OMP_NUM_THREADS': '4'
        }, 8, 4),  # the user's
        ({}, 8, 1),  # torchrun and MMEngine set 1 with several ranks
        ({}, 1, 16),  # one process: torch's own
        ({
            'OMP_NUM_THREADS': 'x'
        }, 1, 16),
    ])
def test_threads_per_rank(environ, world, expected):
    assert threads_per_rank(environ, world, torch_threads=16) == expected


def test_the_demos_node_section(demo_data, monkeypatch):
    monkeypatch.delenv('OMP_NUM_THREADS', raising=False)  # several ranks: 1 thread each
    cfg = Config.fromfile(DEMO_CONFIG)
    cfg.train_dataloader.dataset.data_root = demo_data.rstrip('/') + '/'
    cfg.train_dataloader.num_workers = 2
    node = node_report(cfg, world_size=8, nnodes=2, per_device_batch=4)
    assert node['ranks_per_node'] == 4 and node['not_measured'] is None
    figures = {f['name']: f for f in node['figures']}
    assert list(figures) == ['host memory', 'shared memory', 'threads', 'batchnorm batch']
    assert all(f['need'] is not None for f in figures.values())
    assert figures['threads']['need'] == 4 * (1 + 2)  # 4 ranks x (1 thread + 2 workers)
    assert figures['batchnorm batch']['have'] == 4 and figures['batchnorm batch']['fits'] is False
    lines = render_node(node)
    assert lines[0].startswith('node: 4 rank(s) on each; this node has ')
    assert any(line.split()[:2] == ['shared', 'memory'] for line in lines[1:])
