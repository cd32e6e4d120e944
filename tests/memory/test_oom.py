"""Out-of-memory recognition and advice (pure), and the budget's error classification."""
import pytest
import torch

from mmddp_ext.memory.budget import is_oom_error
from mmddp_ext.memory.oom import fitting_batch, is_oom, oom_advice, requested_bytes

CPU_MESSAGE = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't "
               "allocate memory: you tried to allocate 16777216 bytes. Error code 12")
GPU_MESSAGE = ('CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of '
               '23.64 GiB of which 1.02 GiB is free.')


@pytest.mark.parametrize('exc_type, message, expected', [
    ('RuntimeError', CPU_MESSAGE, True),
    ('OutOfMemoryError', GPU_MESSAGE, True),
    ('RuntimeError', 'std::bad_alloc', True),
    ('ValueError', 'batch_size should be a positive integer', False),
])
def test_is_oom(exc_type, message, expected):
    assert is_oom(exc_type, message) is expected


def test_requested_bytes_reads_both_allocators():
    assert requested_bytes(CPU_MESSAGE) == 16777216
    assert requested_bytes(GPU_MESSAGE) == int(1.5 * 2 ** 30)
    assert requested_bytes('no size here') is None


@pytest.mark.parametrize('exc, expected', [
    (torch.OutOfMemoryError('CUDA out of memory.'), True),
    (MemoryError(), True),
    (RuntimeError(CPU_MESSAGE), True),
    (RuntimeError('could not create a primitive'), False),   # no address-space limit here
    (ValueError(CPU_MESSAGE), False),
])
def test_is_oom_error(exc, expected):
    assert is_oom_error(exc) is expected


def test_fitting_batch_from_gpu_measurements():
    gib = 2 ** 30
    # 2 GiB baseline, 10 GiB peak at batch 32 (8 GiB for 32 samples), 24 GiB device, no others
    fit, how = fitting_batch(32, dict(allocated=2 * gib),
                             dict(peak_allocated=10 * gib, reserved=11 * gib,
                                  device_used=11 * gib, device_total=24 * gib), None)
    assert fit == 31            # (0.9 × 24 − 2) / 0.25 = 78, capped below the failing batch
    assert 'measured: 256.0 MiB per sample' in how
    fit, _ = fitting_batch(32, dict(allocated=2 * gib),
                           dict(peak_allocated=20 * gib, reserved=21 * gib,
                                device_used=23 * gib, device_total=24 * gib), 4 * gib)
    # another process holds 23 − 21 = 2 GiB; the failed request (4 GiB) counts as needed:
    # room 0.9 × (24 − 2) − 2 = 17.8 GiB, per sample (20 + 4 − 2) / 32 = 0.6875 GiB → 25
    assert fit == 25


def test_cpu_advice_halves_and_names_every_way_out():
    record = dict(message=CPU_MESSAGE, gradient_as_bucket_view=False,
                  plan=dict(per_device_batch_size=32, world_size=2, accumulative_counts=1,
                            global_batch_size=64), memory=dict(last=dict(rss=1)))
    lines = oom_advice(record)
    assert lines[0] == 'cause: out of memory at per-device batch 32 (32 × 2 × accumulation 1 ' \
                       '= global 64)'
    assert 'per-device batch 16 × 2 × accumulation 2 keeps the global batch 64' in lines[1]
    assert 'scaling.max_batch_per_device=16' in lines[2]
    assert 'scaling.max_batch_per_device=auto' in lines[3] and 'on_oom=microbatch' in lines[3]
    assert 'gradient_as_bucket_view is off' in lines[4]
