"""memory/peak: a resettable peak of this process's memory. On a CPU it is the kernel's peak
RSS, which a reset brings back to what the process holds now."""
import torch

from mmddp_ext.memory.peak import read_peak, reset_peak

CPU = torch.device('cpu')
BLOCK = 256 * 2**20


def test_a_step_that_touches_memory_raises_the_peak_and_a_reset_forgets_it():
    assert reset_peak(CPU)  # Linux >= 4.0: /proc/self/clear_refs
    before = read_peak(CPU)
    block = torch.ones(BLOCK // 4, dtype=torch.float32)  # 256 MiB, every page touched
    during = read_peak(CPU)
    assert during - before >= BLOCK * 0.9
    del block  # an allocation this large is returned to the kernel when freed
    # a peak stays until reset (the kernel's RSS counters are batched per thread: a few
    # hundred KiB either way)
    assert read_peak(CPU) - before >= BLOCK * 0.9
    assert reset_peak(CPU)
    assert read_peak(CPU) < during - BLOCK * 0.5
