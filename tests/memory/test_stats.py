"""MemoryReader: host numbers on CPU; on a GPU it never resets torch's peak counters."""
import pytest
import torch

from mmddp_ext.memory.stats import MemoryReader


def test_cpu_sample_has_host_numbers_only():
    block = bytearray(64 * 2 ** 20)  # 64 MiB touched: RSS must cover it
    sample = MemoryReader(3, 'cpu').read(7)
    assert (sample.rank, sample.iter, sample.device) == (3, 7, 'cpu')
    assert sample.allocated is None and sample.device_total is None
    assert sample.rss >= len(block) and sample.peak_rss >= sample.rss
    assert sample.mib('rss') == round(sample.rss / 2 ** 20, 1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU')
def test_gpu_read_keeps_mmengine_peak_counter():
    reader = MemoryReader(0, 'cuda:0')
    big = torch.empty(256 * 2 ** 20, dtype=torch.uint8, device='cuda:0')
    del big
    torch_peak = torch.cuda.max_memory_allocated(0)
    sample = reader.read(1)
    assert torch.cuda.max_memory_allocated(0) == torch_peak  # not reset by us
    assert sample.peak_allocated >= 256 * 2 ** 20
    torch.cuda.reset_peak_memory_stats(0)  # what MMEngine's LogProcessor does when it logs
    assert reader.read(2).peak_allocated >= 256 * 2 ** 20  # our running peak survives it
