"""entry/node_report: the threads a rank computes with, and the node section of --explain on the
demo's own data (its 2 workers), as JSON and as lines."""
import pytest
from mmengine.config import Config

from mmddp_ext.entry.node_report import node_report, render_node, threads_per_rank

from conftest import DEMO_CONFIG


@pytest.mark.parametrize(
    'environ,ranks,world,workers,expected',
    [
        ({
            'OMP_NUM_THREADS': '4'
        }, 8, 8, 2, 4),  # the user's
        ({}, 8, 8, 0, 2),  # 16 cores shared by 8 ranks
        ({}, 4, 8, 2, 2),  # 16 / 4, less 2 workers
        ({}, 8, 8, 4, 1),  # never below one
        ({
            'OMP_NUM_THREADS': '1',
            'MMDDP_OMP_UNSET': '1'
        }, 2, 2, 0, 8),  # torchrun's 1, no choice of the user's
        ({}, 1, 1, 2, 16),  # one process: torch's own
        ({
            'OMP_NUM_THREADS': 'x'
        }, 1, 1, 0, 16),
    ])
def test_threads_per_rank(environ, ranks, world, workers, expected):
    assert threads_per_rank(environ, ranks, world, 16, workers, torch_threads=16) == expected


def test_the_demos_node_section(demo_data, monkeypatch):
    monkeypatch.delenv('OMP_NUM_THREADS', raising=False)  # the node's cores, shared
    cfg = Config.fromfile(DEMO_CONFIG)
    cfg.train_dataloader.dataset.data_root = demo_data.rstrip('/') + '/'
    cfg.train_dataloader.num_workers = 2
    node = node_report(cfg, world_size=8, nnodes=2, per_device_batch=4)
    assert node['ranks_per_node'] == 4 and node['not_measured'] is None
    figures = {f['name']: f for f in node['figures']}
    assert list(figures) == ['host memory', 'shared memory', 'threads', 'batchnorm batch']
    assert all(f['need'] is not None for f in figures.values())
    threads = max(1, node['cpus'] // 4 - 2)  # the cores shared by 4 ranks, less 2 workers each
    assert figures['threads']['need'] == 4 * (threads + 2)
    assert figures['batchnorm batch']['have'] == 4 and figures['batchnorm batch']['fits'] is False
    lines = render_node(node)
    assert lines[0].startswith('node: 4 rank(s) on each; this node has ')
    assert any(line.split()[:2] == ['shared', 'memory'] for line in lines[1:])
