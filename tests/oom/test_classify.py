"""Out-of-memory recognition: the one classifier, for live errors and failure records."""
import pytest
import torch

from mmddp_ext.oom import classify
from mmddp_ext.oom.classify import is_oom, is_oom_error

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
    monkeypatch.setattr(classify, 'address_space_limit', lambda: 2**30 if limited else None)
    assert is_oom_error(exc) is expected


def test_is_oom_error_follows_the_cause(monkeypatch):
    monkeypatch.setattr(classify, 'address_space_limit', lambda: None)
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
    monkeypatch.setattr(classify, 'address_space_limit', lambda: 2**30 if limited else None)
    for exc in (RuntimeError(CPU_MESSAGE), ONEDNN, MAP, ValueError('no'), MemoryError('x')):
        assert is_oom(type(exc).__name__, str(exc), limited) is is_oom_error(exc)
