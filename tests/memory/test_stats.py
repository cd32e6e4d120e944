"""MemoryReader: host numbers on CPU; on a GPU it never resets torch's peak counters."""
import os.path as osp

import pytest
import torch

from mmddp_ext.memory.stats import MemoryReader

from tests.helpers.proc_status import proc_status


def test_cpu_sample_has_host_numbers_only():
    sample = MemoryReader(3, 'cpu').read(7)
    assert (sample.rank, sample.iter, sample.device) == (3, 7, 'cpu')
    assert sample.allocated is None and sample.reserved is None
    assert sample.peak_allocated is None and sample.device_used is None
    assert sample.device_total is None
    assert 0 < sample.rss <= sample.peak_rss
    assert sample.mib('rss') == round(sample.rss / 2**20, 1)


def _smaps_rss() -> int:
    """This process's resident bytes counted page by page (/proc/self/smaps_rollup walks the
    page tables: exact, where the status counters may lag by a few per-CPU batches)."""
    with open('/proc/self/smaps_rollup') as f:
        for line in f:
            if line.startswith('Rss:'):
                return int(line.split()[1]) * 1024
    raise AssertionError('no Rss in /proc/self/smaps_rollup')


def _read_beside(reader, it):
    """The reader's sample, bracketed by /proc's VmRSS read just before and just after it."""
    low = proc_status('VmRSS')['VmRSS']
    sample = reader.read(it)
    high = proc_status('VmRSS')['VmRSS']
    return sample, low, high


def _close(sample, low: int, high: int) -> bool:
    """The reader's RSS is what /proc said beside it: between the two readings, give or take
    the little the read itself allocates or frees (1 MiB)."""
    slack = 2**20
    return min(low, high) - slack <= sample.rss <= max(low, high) + slack


@pytest.mark.skipif(not osp.exists('/proc/self/smaps_rollup'), reason='needs Linux /proc')
def test_cpu_rss_follows_a_known_allocation():
    """256 MiB written page by page: the reader's RSS is /proc's VmRSS at every reading, it
    grows by as much as /proc's did, at least by the 256 MiB (every page written is resident),
    the peak keeps it, and RSS falls back once it is freed (256 MiB is above glibc's largest
    mmap threshold: the block is its own mapping, returned to the system by ``del``)."""
    reader = MemoryReader(0, 'cpu')
    reader.read(0)  # psutil imported and its Process made: not part of the growth below
    size = 256 * 2**20
    exact_before = _smaps_rss()
    before, b_low, b_high = _read_beside(reader, 1)
    block = torch.ones(size, dtype=torch.uint8)  # every page written: resident
    during, d_low, d_high = _read_beside(reader, 2)
    exact_during = _smaps_rss()
    assert _close(before, b_low, b_high), (before.rss, b_low, b_high)
    assert _close(during, d_low, d_high), (during.rss, d_low, d_high)
    grown = during.rss - before.rss
    # /proc's growth over the same two points, with the spread of each bracket
    assert d_low - b_high - 2 * 2**20 <= grown <= d_high - b_low + 2 * 2**20, grown / 2**20
    assert exact_during - exact_before >= size, (exact_during - exact_before) / 2**20
    assert during.peak_rss >= during.rss
    assert during.peak_rss >= proc_status('VmHWM')['VmHWM'] - 2**20 >= d_low - 2**20
    assert during.mib('rss') - before.mib('rss') == pytest.approx(grown / 2**20, abs=0.1)
    del block
    after, a_low, a_high = _read_beside(reader, 3)
    assert _close(after, a_low, a_high), (after.rss, a_low, a_high)
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
