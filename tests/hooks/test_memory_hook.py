"""RankMemoryHook on a real 2-process CPU run, its table, and a real out-of-memory diagnosis."""
import glob
import json
import os.path as osp
import re

import psutil
import pytest

from mmddp_ext.hooks.memory_hook import RankMemoryHook, format_table

from conftest import demo_options, demo_with_hooks
from preloaded import dist_train

GIB = 2**30
MIB = 2**20


def _sample(rank, device='cpu', **kw):
    base = dict(rank=rank, host='node1', pid=727401 + rank, device=device, iter=50, allocated=None,
                reserved=None, peak_allocated=None, device_used=None, device_total=None,
                rss=1500 * 2**20, peak_rss=1600 * 2**20, time=0.0)
    base.update(kw)
    return base


def test_table_cpu_is_labelled_as_host_memory():
    text = format_table([_sample(0), _sample(1)])
    assert 'CPU run: host RSS (peak RSS) per rank; no device memory' in text
    assert 'rank 1 node1 pid 727402 cpu: RSS 1500 (1600)' in text


def test_table_gpu_numbers_in_mib():
    gpu = _sample(0, 'cuda:0', allocated=int(20 * GIB), reserved=int(21.5 * GIB),
                  peak_allocated=int(21 * GIB), device_used=int(23.58 * GIB),
                  device_total=int(23.64 * GIB))
    text = format_table([gpu])
    assert 'rank 0 node1 pid 727401 cuda:0: 20480 / 22016 / 21504 | 24146 of 24207' in text


@pytest.mark.parametrize('bad', [0, -1, 2.5, True, '50'])
def test_interval_is_checked(bad):
    with pytest.raises(ValueError, match=f'interval={bad!r}'):
        RankMemoryHook(interval=bad)


def test_two_process_run_logs_writes_and_plots(healthy_run):
    """The shared healthy run (``conftest.healthy_run``): RankMemoryHook(interval=1), with
    /proc read beside each of its readings (``tests.helpers.read_beside_hook``)."""
    out = healthy_run.out
    # 64 images, 2 ranks × 16 per device: 2 iterations; a sample after each, on every rank
    [log_dir] = glob.glob(osp.join(healthy_run.work, '2*'))
    pids = {int(p) for p in re.findall(r'rank [01] \S+ pid (\d+) cpu: RSS', out)}
    # the parameter count the agreement check logged for this run
    weights = 4 * int(re.search(r'ranks agree: .*?parameters \d+ tensors, (\d+) values', out)[1])
    for rank in (0, 1):
        lines = [json.loads(x) for x in open(osp.join(log_dir, 'memory', f'rank{rank}.jsonl'))]
        assert [s['iter'] for s in lines] == [1, 2]
        assert all(s['rank'] == rank and s['device'] == 'cpu' for s in lines)
        assert {s['pid'] for s in lines} <= pids and len({s['pid'] for s in lines}) == 1
        # after a step a rank holds its float32 weights and Adam's two moments of them (all
        # written, so resident), besides the interpreter and torch; and less than the host
        assert all(3 * weights < s['rss'] <= s['peak_rss'] < psutil.virtual_memory().total
                   for s in lines)
        # what it logged is what /proc said right beside each reading (VmRSS read just before
        # and just after it; 1 MiB for what the reading itself allocates or frees) ...
        with open(osp.join(healthy_run.beside, f'beside_rank{rank}.jsonl')) as f:
            near = {b['iter']: b for b in map(json.loads, f)}
        for s in lines:
            b = near[s['iter']]
            assert (s['rss'], s['peak_rss']) == (b['rss'], b['peak_rss'])  # that very reading
            assert min(b['rss_low'], b['rss_high']) - MIB <= s['rss'] <= \
                max(b['rss_low'], b['rss_high']) + MIB, (s, b)
            # ... and the peak is the process's high-water mark, not the current size. Linux
            # reports VmHWM (and ru_maxrss) as max(the stored high-water mark, the RSS now),
            # and stores the mark lazily (at unmaps): what RSS gave up between the reading
            # before and the hook's own may be missing from both, and no more than that
            fell = max(0, b['rss_low'] - b['rss_high'])
            assert s['peak_rss'] >= b['hwm_low'] - fell - MIB, (s, b)
        # a peak above the RSS of its moment is the stored mark, and a stored mark is kept
        # (a peak equal to the RSS then may be the RSS alone: Linux stores the mark lazily,
        # and a real run reported 1208632 KiB, then 1208476 KiB, at two RSS readings)
        if lines[0]['peak_rss'] > lines[0]['rss'] + MIB:
            assert lines[1]['peak_rss'] >= lines[0]['peak_rss'] - MIB, lines
    assert len(pids) == 2  # one process per rank, both named in the table
    assert out.count('CPU run: host RSS (peak RSS) per rank') == 2
    assert 'rank 1 ' in out.split('CPU run: host RSS (peak RSS) per rank')[1]
    scalars = [json.loads(x) for x in open(osp.join(log_dir, 'vis_data', 'scalars.json'))]
    keys = set().union(*scalars)
    assert {'memory/rank0/rss_mib', 'memory/rank1/peak_rss_mib'} <= keys
    png = osp.join(log_dir, 'memory', 'memory.png')
    assert open(png, 'rb').read(8) == b'\x89PNG\r\n\x1a\n' and osp.getsize(png) > 5000


# What an allocator says when it cannot allocate: torch's CPU allocator (``DefaultCPUAllocator:
# can't allocate memory: you tried to allocate N bytes``), oneDNN's workspace, the C++ runtime,
# torch's CUDA allocator.
ALLOCATOR_FAILURE = re.compile(
    r"DefaultCPUAllocator: can't allocate memory: you tried to allocate \d+ bytes"
    r"|could not create a primitive|std::bad_alloc|out of memory", re.IGNORECASE)


@pytest.mark.slow
def test_real_out_of_memory_on_one_rank_is_diagnosed(demo_data, tmp_path):
    """Rank 1 gets a budget measured on the spot to be too small for a step (half the bytes
    of the parameters, where Adam's first step alone needs twice that), so torch's CPU
    allocator fails for real."""
    cfg = demo_with_hooks(tmp_path, "dict(type='StepBudgetHook', rank=1, fraction=0.5)",
                          ['step_budget_hook'])
    work = str(tmp_path / 'w')
    # by hand from the preloaded stack, the diagnosis after the ranks as dist_train.sh runs it
    proc = dist_train([
        cfg, '--work-dir', work, *demo_options(demo_data, 1, **{'scaling.global_batch_size': '64'})
    ], 2, str(tmp_path / 'ranks'), diagnose=True)
    assert proc.returncode != 0
    measured = json.load(open(osp.join(work, 'step_budget_rank1.json')))
    assert measured['optimizer'] == 'Adam'  # 2 × the parameters' bytes of state
    assert measured['budget_mib'] * 2**20 <= measured['param_bytes'] / 2
    assert not osp.exists(osp.join(work, 'step_budget_rank0.json'))  # rank 1 only
    record = json.load(open(osp.join(work, 'failures', 'rank1.json')))
    assert record['exc_type'] == 'MemoryError' or ALLOCATOR_FAILURE.search(record['message']), \
        record
    assert record['plan']['per_device_batch_size'] == 64 // 2
    # the parameters (written at initialisation: resident) are a known part of the process, and
    # nothing resident lies outside the address space it was limited to
    now = record['memory']['now']
    assert measured['param_bytes'] <= now['rss'] <= measured['as_limit_bytes'], (now, measured)
    assert 'baseline' in record['memory']
    tail = proc.stdout[proc.stdout.rindex('==== mmddp_ext diagnosis'):]
    assert 'first failing rank: 1' in tail
    assert 'cause: out of memory at per-device batch 32 (32 × 2 × accumulation 1 = global 64)' \
        in tail
    assert 'per-device batch 16 × 2 × accumulation 2 keeps the global batch 64' in tail
    assert '--cfg-options scaling.max_batch_per_device=16' in tail
