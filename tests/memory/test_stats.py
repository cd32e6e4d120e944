"""MemoryReader: host numbers on CPU; on a GPU it never resets torch's peak counters."""
import pytest
import torch

from mmddp_ext.memory.stats import MemoryReader


def test_cpu_sample_has_host_numbers_only():
    sample = MemoryReader(3, 'cpu').read(7)
    assert (sample.rank, sample.iter, sample.device) == (3, 7, 'cpu')
    assert sample.allocated is None and sample.reserved is None
    assert sample.peak_allocated is None and sample.device_used is None
    assert sample.device_total is None
    assert 0 < sample.rss <= sample.peak_rss
    assert sample.mib('rss') == round(sample.rss / 2**20, 1)


def test_cpu_rss_follows_a_known_allocation():
    """256 MiB written page by page: RSS grows by that much over a reading taken just before,
    the peak keeps it, and RSS falls back once it is freed."""
    reader = MemoryReader(0, 'cpu')
    size = 256 * 2**20
    before = reader.read(1)
    block = torch.ones(size, dtype=torch.uint8)  # every page written: resident
    during = reader.read(2)
    grown = during.rss - before.rss
    assert 0.95 * size <= grown <= size + 32 * 2**20, grown / 2**20
    assert during.peak_rss >= during.rss >= before.rss + 0.95 * size
    assert during.mib('rss') - before.mib('rss') == pytest.approx(grown / 2**20, abs=0.1)
    del block
    after = reader.read(3)
    assert after.rss <= during.rss - size // 2, 'rss is the current size, not the peak'
    assert after.peak_rss >= during.rss * 0.99  # the peak remembers the block


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU')
def test_gpu_read_keeps_mmengine_peak_counter():
    reader = MemoryReader(0, 'cuda:0')
    big = torch.empty(256 * 2**20, dtype=torch.uint8, device='cuda:0')
    del big
    torch_peak = torch.cuda.max_memory_allocated(0)
    sample = reader.read(1)
    assert torch.cuda.max_memory_allocated(0) == torch_peak  # not reset by us
    assert sample.peak_allocated >= 256 * 2**20
    torch.cuda.reset_peak_memory_stats(0)  # what MMEngine's LogProcessor does when it logs
    assert reader.read(2).peak_allocated >= 256 * 2**20  # our running peak survives it
