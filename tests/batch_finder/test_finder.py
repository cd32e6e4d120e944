"""batch_finder/finder: a result stored by an earlier run of the same job is read back on every
rank without measuring again; a changed job measures again. The measurement itself, on real
ranks under a real memory budget: tests/e2e/test_oom_handling.py."""
import torch

from mmddp_ext.batch_finder.cache import cache_location, write_cache
from mmddp_ext.batch_finder.finder import find_max_batch
from mmddp_ext.batch_finder.search import SearchResult, Trial
from mmddp_ext.memory.budget import Budget
from mmddp_ext.utils.config import load_config

from conftest import DEMO_CONFIG

CPU = torch.device('cpu')


def test_a_stored_result_is_used_without_a_trial(tmp_path, monkeypatch):
    cfg = load_config(DEMO_CONFIG, {'work_dir': str(tmp_path)})
    stored = cache_location(cfg, 2, 32, CPU, 1500)
    found = SearchResult(
        12, 32,
        (Trial(32, False, 1.0), Trial(16, False, 1.0), Trial(8, True, 1.0), Trial(12, True, 1.0)))
    write_cache(stored.path, stored.key, found, 'test')
    monkeypatch.setattr('mmddp_ext.batch_finder.finder.Trials', None)  # a trial would raise
    result, baseline, where = find_max_batch(cfg, 2, 32, Budget('cpu', 1500 * 2**20, 'test'), 1500,
                                             CPU)
    assert result.max_batch == 12 and baseline is None and where == stored


def test_another_job_does_not_read_it(tmp_path):
    cfg = load_config(DEMO_CONFIG, {'work_dir': str(tmp_path)})
    stored = cache_location(cfg, 2, 32, CPU, 1500)
    others = [
        cache_location(cfg, 4, 32, CPU, 1500),
        cache_location(cfg, 2, 16, CPU, 1500),
        cache_location(cfg, 2, 32, CPU, 1000),
        cache_location(
            load_config(DEMO_CONFIG, {
                'work_dir': str(tmp_path),
                'optim_wrapper.optimizer.lr': 1.0
            }), 2, 32, CPU, 1500)
    ]
    assert all(o.path == stored.path and o.key != stored.key for o in others)
