"""Two real ranks on one fake GPU host, the GPU-rank rehearsal: each rank decides as a GPU rank
does (nccl, DDP on its own device, SyncBN kept; replaced where its CPU tensors need it, each
replacement said in one line), the ranks agree on local ranks 0 and 1, each pins its own GPU
before any reading, the memory hook reads device memory and names the stray context (the
user's case: rank 1's process holding memory on GPU 0, and a foreign process there), the budget
and the batch finder take their GPU branches, and a resumed run touches only the rank's own GPU.
The ranks compute on the CPU over gloo (docs/memory.md)."""
import glob
import json
import os.path as osp

import pytest

from mmddp_ext.gpu.fake import FIELD_CONTEXT, FIELD_FOREIGN, make_fake_host

from conftest import check_ok, demo_options, demo_with_hooks, once, run

MIB = 2**20
FOREIGN_PID = 4242  # not one of the job's: NVML lists it, the job does not own it
STRAY_MIB = round((FIELD_FOREIGN - FIELD_CONTEXT) / MIB)  # with its context: 1.89 GiB


@pytest.fixture(scope='module')
def fake_run(demo_data, tmp_path_factory):
    """(output, {rank: FakeGpuHook's record}, {rank: RankMemoryHook's samples}) of one
    2-process run on a fake host of 2 GPUs, made once for the session (``conftest.once``)."""

    def build(tmp: str) -> None:
        env = make_fake_host(
            osp.join(tmp, 'host'), count=2, foreign=[(0, FOREIGN_PID, FIELD_FOREIGN)])
        cfg = demo_with_hooks(
            tmp, f"dict(type='FakeGpuHook', out_dir={osp.join(tmp, 'records')!r}, "
            f"stray_rank=1, stray_mib={STRAY_MIB}), dict(type='RankMemoryHook', interval=1)",
            ['fake_gpu_hook'])
        options = {'scaling.max_batch_per_device': 'auto', 'scaling.memory_budget_mib': '6000'}
        out = check_ok(
            run([
                'bash', 'tools/dist_train.sh', cfg, '2', '--work-dir',
                osp.join(tmp, 'w'), *demo_options(demo_data, 1, sync_bn='torch', **options)
            ], env=env))
        with open(osp.join(tmp, 'out.txt'), 'w') as f:
            f.write(out)
        resume_cfg = demo_with_hooks(
            tmp, f"dict(type='FakeGpuHook', out_dir={osp.join(tmp, 'resumed')!r})",
            ['fake_gpu_hook'], 'demo_resumed.py')
        out = check_ok(
            run([
                'bash', 'tools/dist_train.sh', resume_cfg, '2', '--work-dir',
                osp.join(tmp, 'w'), '--resume',
                *demo_options(demo_data, 2, sync_bn='torch', **options)
            ], env=env))
        with open(osp.join(tmp, 'resumed.txt'), 'w') as f:
            f.write(out)

    tmp = once(tmp_path_factory, 'fake_gpu_run', build)
    records = osp.join(tmp, 'records')
    ranks = {r: json.load(open(osp.join(records, f'rank{r}.json'))) for r in (0, 1)}
    log_dir = sorted(glob.glob(osp.join(tmp, 'w', '2*')))[0]  # the first run's
    samples = {
        r: [json.loads(x) for x in open(osp.join(log_dir, 'memory', f'rank{r}.jsonl'))]
        for r in (0, 1)
    }
    return open(osp.join(tmp, 'out.txt')).read(), ranks, samples


@pytest.mark.slow
def test_each_rank_pins_its_own_gpu_before_any_reading(fake_run):
    _, ranks, _ = fake_run
    for r in (0, 1):
        assert ranks[r]['current'] == r
        assert ranks[r]['touched'] == [r], f'rank {r} touched GPUs {ranks[r]["touched"]}'


@pytest.mark.slow
def test_memory_hook_reads_the_rank_s_device(fake_run):
    out, _, samples = fake_run
    for r in (0, 1):
        assert samples[r] and all(s['device'] == f'cuda:{r}' for s in samples[r])
        for s in samples[r]:
            assert s['reserved'] >= s['allocated'] > 0 and s['peak_allocated'] >= s['allocated']
            assert s['device_used'] < s['device_total']
    assert 'CPU run: host RSS' not in out  # the GPU table, not the CPU one


@pytest.mark.slow
def test_stray_context_of_rank_1_on_gpu_0_is_named_with_its_pid(fake_run):
    out, ranks, _ = fake_run
    warnings = [ln for ln in out.splitlines() if '[mmddp_ext memory]' in ln]
    stray = [ln for ln in warnings if f'rank 1 (pid {ranks[1]["pid"]})' in ln]
    assert stray and all('GPU 0' in ln and 'the device of rank 0' in ln for ln in stray), warnings
    assert any(f'pid {FOREIGN_PID}' in ln and 'GPU 0' in ln for ln in warnings), warnings
    # rank 0 holds nothing on rank 1's GPU: it is not named
    assert not any(f'rank 0 (pid {ranks[0]["pid"]})' in ln for ln in warnings), warnings


@pytest.mark.slow
def test_budget_caps_the_device_and_the_finder_measures_on_it(fake_run):
    out, _, _ = fake_run
    assert 'capped at scaling.memory_budget_mib=6000' in out
    assert 'GPU memory of cuda:0' in out
    assert 'batch probe' in out and 'the measurement of per-device batch' in out


@pytest.fixture(scope='module')
def resumed(fake_run, tmp_path_factory):
    """(output, {rank: FakeGpuHook's record}) of the resumed run, and its work dir."""
    tmp = once(tmp_path_factory, 'fake_gpu_run', lambda _: None)  # built by fake_run
    folder = osp.join(tmp, 'resumed')
    ranks = {r: json.load(open(osp.join(folder, f'rank{r}.json'))) for r in (0, 1)}
    return open(osp.join(tmp, 'resumed.txt')).read(), ranks, osp.join(tmp, 'w')


@pytest.mark.slow
def test_each_rank_decides_as_a_gpu_rank_and_says_what_the_cpu_uses_instead(fake_run):
    out, ranks, _ = fake_run
    for r in (0, 1):
        # max_batch_per_device='auto' guards the steps: MicrobatchDDP, which takes no device
        # ids (tests/gpu/test_rehearsal.py has DDP's)
        backend, sync_bn = ranks[r]['replacements']
        assert backend == ('fake GPU host: process-group backend nccl as on a GPU; gloo used '
                           '(its tensors stay on the CPU)'), ranks[r]
        assert sync_bn.startswith('fake GPU host: SyncBN ') and \
            'layer(s) kept as on a GPU; BatchNorm used' in sync_bn
        assert int(sync_bn.split('SyncBN ')[1].split()[0]) > 0  # sync_bn='torch' converted them
    assert '[mmddp_ext] fake GPU host: process-group backend nccl as on a GPU' in out  # rank 0
    assert 'training on CPUs' not in out  # the CPU branch was not taken


@pytest.mark.slow
def test_local_ranks_0_and_1_agree_on_the_config(fake_run):
    out, _, _ = fake_run
    assert '2 ranks agree' in out and 'ranks disagree' not in out


@pytest.mark.slow
def test_resume_continues_and_touches_only_the_rank_s_own_gpu(resumed):
    out, ranks, work = resumed
    assert 'Epoch(train) [2]' in out and 'Epoch(train) [1]' not in out, out[-3000:]
    assert osp.isfile(osp.join(work, 'epoch_2.pth'))
    for r in (0, 1):  # the checkpoint was loaded to the CPU (map_location='cpu'), not GPU 0
        assert ranks[r]['current'] == r and ranks[r]['touched'] == [r], ranks[r]
