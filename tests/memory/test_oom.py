"""Out-of-memory recognition (the one classifier) and the batch that fits (pure); the advice
built on them is in ``tests/diagnose/test_oom_advice.py``."""
import pytest
import torch

from mmddp_ext.memory import oom as oom_module
from mmddp_ext.memory.oom import fitting_batch, is_oom, is_oom_error, requested_bytes

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
    assert requested_bytes(GPU_MESSAGE) == int(1.5 * 2**30)
    assert requested_bytes('no size here') is None


ONEDNN = RuntimeError('could not create a primitive')
MAP = ImportError('libtorch_cpu.so: failed to map segment from shared object')


@pytest.mark.parametrize(
    'exc, limited, expected',
    [
        (torch.OutOfMemoryError('CUDA out of memory.'), False, True),
        (MemoryError(), False, True),
        (RuntimeError(CPU_MESSAGE), False, True),
        (ValueError(CPU_MESSAGE), False, True),  # the allocator's text, whatever wraps it
        (ValueError('batch_size should be a positive integer'), True, False),
        (ONEDNN, False, False),  # without a limit: not memory
        (ONEDNN, True, True),  # under an address-space limit: memory
        (MAP, False, False),
        (MAP, True, True),
        (OSError(12, 'Cannot allocate memory'), False, True),
    ])
def test_is_oom_error(monkeypatch, exc, limited, expected):
    # the limit is set here, not read from this machine (a `ulimit -v` must not change it)
    monkeypatch.setattr(oom_module, 'address_space_limit', lambda: 2**30 if limited else None)
    assert is_oom_error(exc) is expected


def test_is_oom_error_follows_the_cause(monkeypatch):
    monkeypatch.setattr(oom_module, 'address_space_limit', lambda: None)
    try:
        try:
            raise torch.OutOfMemoryError('CUDA out of memory.')
        except torch.OutOfMemoryError as e:
            raise RuntimeError('step failed') from e
    except RuntimeError as wrapped:
        assert is_oom_error(wrapped)
    assert not is_oom_error(RuntimeError('step failed'))


@pytest.mark.parametrize('limited', [False, True])
def test_records_and_live_errors_agree(monkeypatch, limited):
    """A failure record (type name, message, whether the address space was limited) is
    classified as the live error was."""
    monkeypatch.setattr(oom_module, 'address_space_limit', lambda: 2**30 if limited else None)
    for exc in (RuntimeError(CPU_MESSAGE), ONEDNN, MAP, ValueError('no'), MemoryError('x')):
        assert is_oom(type(exc).__name__, str(exc), limited) is is_oom_error(exc)


def test_fitting_batch_from_gpu_measurements():
    gib = 2**30
    # 2 GiB baseline, 10 GiB peak at batch 32 (8 GiB for 32 samples), 24 GiB device, no others
    fit, how = fitting_batch(
        32, dict(allocated=2 * gib),
        dict(peak_allocated=10 * gib, reserved=11 * gib, device_used=11 * gib,
             device_total=24 * gib), None)
    assert fit == 31  # (0.9 × 24 − 2) / 0.25 = 78, capped below the failing batch
    assert 'measured: 256.0 MiB per sample' in how
    fit, _ = fitting_batch(
        32, dict(allocated=2 * gib),
        dict(peak_allocated=20 * gib, reserved=21 * gib, device_used=23 * gib,
             device_total=24 * gib), 4 * gib)
    # another process holds 23 − 21 = 2 GiB; the failed request (4 GiB) counts as needed:
    # room 0.9 × (24 − 2) − 2 = 17.8 GiB, per sample (20 + 4 − 2) / 32 = 0.6875 GiB → 25
    assert fit == 25


def test_release_memory_collects_what_a_failed_attempt_left_in_cycles():
    import gc
    import weakref

    import torch

    from mmddp_ext.memory.oom import release_memory

    class Frame:  # a traceback's frames reference each other: a cycle holding a tensor
        pass

    a, b = Frame(), Frame()
    a.other, b.other, a.tensor = b, a, torch.zeros(1024)
    alive = weakref.ref(a)
    gc.disable()  # only release_memory may collect here
    try:
        del a, b
        assert alive() is not None
        release_memory()
        assert alive() is None
    finally:
        gc.enable()
