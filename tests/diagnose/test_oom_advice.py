"""The advice under an out-of-memory failure (pure): the split that keeps the global batch, or
why no batch fits."""
from mmddp_ext.diagnose.oom_advice import oom_advice

CPU_MESSAGE = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't "
               "allocate memory: you tried to allocate 16777216 bytes. Error code 12")
MAP = ImportError('libtorch_cpu.so: failed to map segment from shared object')


def test_advice_when_micro_batches_of_one_did_not_fit():
    """on_oom='microbatch' measured that nothing fits: no batch is suggested."""
    record = dict(message='out of memory even with micro-batches of 1 sample', oom_at_batch=1,
                  memory_budget_mib=750, plan=dict(per_device_batch_size=16, world_size=2,
                                                   accumulative_counts=1))
    lines = oom_advice(record)
    assert 'no per-device batch fits within scaling.memory_budget_mib=750' in lines[0]
    assert not any('max_batch_per_device=' in line for line in lines)


def test_advice_starts_from_the_micro_batch_that_failed():
    record = dict(
        message=CPU_MESSAGE, oom_at_batch=4, memory=dict(last=dict(rss=1)),
        plan=dict(per_device_batch_size=16, world_size=2, accumulative_counts=1,
                  global_batch_size=32))
    lines = oom_advice(record)
    assert lines[0].startswith('cause: out of memory at micro-batches of 4 of per-device batch 16')
    assert 'per-device batch 2 × 2 × accumulation 8 keeps the global batch 32' in lines[1]


def test_advice_for_a_budget_too_small_to_import():
    lines = oom_advice(dict(message=str(MAP), memory_budget_mib=150, oom=True))
    assert 'while loading a library' in lines[0] and 'scaling.memory_budget_mib=150' in lines[0]
    assert 'raise scaling.memory_budget_mib' in lines[1]


def test_cpu_advice_halves_and_names_every_way_out():
    record = dict(
        message=CPU_MESSAGE, gradient_as_bucket_view=False,
        plan=dict(per_device_batch_size=32, world_size=2, accumulative_counts=1,
                  global_batch_size=64), memory=dict(last=dict(rss=1)))
    lines = oom_advice(record)
    assert lines[0] == 'cause: out of memory at per-device batch 32 (32 × 2 × accumulation 1 ' \
                       '= global 64)'
    assert 'per-device batch 16 × 2 × accumulation 2 keeps the global batch 64' in lines[1]
    assert 'scaling.max_batch_per_device=16' in lines[2]
    assert 'scaling.max_batch_per_device=auto' in lines[3] and 'on_oom=microbatch' in lines[3]
    assert 'gradient_as_bucket_view is off' in lines[4]
