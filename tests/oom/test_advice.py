"""The advice under an out-of-memory failure: the failed allocation's size, the per-device
batch that fits (pure), and the lines the diagnosis shows."""
from mmddp_ext.oom.advice import fitting_batch, oom_advice, requested_bytes

CPU_MESSAGE = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't "
               "allocate memory: you tried to allocate 16777216 bytes. Error code 12")
MAP = ImportError('libtorch_cpu.so: failed to map segment from shared object')

GPU_MESSAGE = ('CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of '
               '23.64 GiB of which 1.02 GiB is free.')


def test_requested_bytes_reads_both_allocators():
    assert requested_bytes(CPU_MESSAGE) == 16777216
    assert requested_bytes(GPU_MESSAGE) == int(1.5 * 2**30)
    assert requested_bytes('no size here') is None


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


def test_the_batch_that_ran_out_is_named_beside_what_the_finder_measured():
    record = dict(
        message=CPU_MESSAGE, memory=dict(last=dict(rss=1)),
        oom_batch=dict(samples=[12, 40], shape=[384, 384], objects=31), finder=dict(
            max_batch=8, reserve=1, extra=0, samples="the heaviest of rank 1's share (64 "
            'samples): 128×128 padded, 4 objects (samples 2, 6)'),
        plan=dict(per_device_batch_size=8, world_size=2, accumulative_counts=1,
                  global_batch_size=16))
    lines = oom_advice(record)
    assert lines[0].startswith('cause: out of memory at per-device batch 8')
    assert lines[1] == 'batch: 2 samples up to 384×384, 31 objects (images 12, 40)'
    assert lines[2] == ("the finder measured: the heaviest of rank 1's share (64 samples): "
                        '128×128 padded, 4 objects (samples 2, 6)')
