"""Batch finding (``max_batch_per_device='auto'``) and ``on_oom='microbatch'``: 2 gloo
processes, one of them under a tighter address-space limit measured on the spot (a real
out-of-memory error: the finder's trials, the guard's redone step, the agreed stop), or with an
out-of-memory error injected above a batch size where a test needs the finder's answer fixed
(the found batch that fails later in training); the demo at 128×128 input (activations grow
with the batch enough to matter on a CPU). The ranks are started by hand from the preloaded
stack (``tests/preloaded.py``), and so is the process that measures where a limit goes, so
that the limit counts from the same point of the same kind of process; where every rank's
record is asserted after one rank failed, under ``dist_train.sh``, both afresh."""
import json
import math
import os.path as osp
import re

import pytest

from mmddp_ext.diagnose.records import read_failures as read_failure_records

from conftest import DEMO_CONFIG, PYTHON, ROOT, check_ok, demo_options, read_records, run
from preloaded import dist_train, start, train

DEMO_128 = osp.join(ROOT, 'configs', 'demo', 'td-hm_res18_1xb32-30e_demo-128x128.py')
MEASURE = osp.join(ROOT, 'tests', 'helpers', 'measure_trial_peaks.py')


def _config(tmp_path, record_dir, modules=(), hooks=''):
    imports = ['mmddp_ext', 'tests.helpers.rank_record_hook'
               ] + [f'tests.helpers.{m}' for m in modules]
    hook_list = f"[dict(type='RankRecordHook', out_dir={record_dir!r}), {hooks}]"
    path = osp.join(str(tmp_path), 'demo128.py')
    with open(path, 'w') as f:
        f.write(f'_base_ = [{DEMO_128!r}]\n'
                f'custom_imports = dict(imports={imports!r}, allow_failed_imports=False)\n'
                f'custom_hooks = {hook_list}\n')
    return path


def _options(demo_data, epochs, slim=False, **extra):
    # no validation (its batch is not probed) and no final checkpoint: training only; the demo's
    # own width where the memory a step takes is measured (slim: where an out-of-memory error
    # is injected or the memory held is the test's own)
    return demo_options(
        demo_data, epochs, slim=slim, **{
            'train_cfg.val_begin': str(epochs + 1),
            'default_hooks.checkpoint.save_last': 'False',
            **extra
        })


@pytest.mark.slow
def test_microbatch_step_equals_ddp_step(tmp_path):
    """MicrobatchDDP (whole and split in 3) against MMEngine's DDP, accumulation 2, different
    data per rank, a model without batch statistics: the same weights."""
    out = str(tmp_path / 'eq')
    proc = run([
        PYTHON, '-m', 'torch.distributed.run', '--nproc_per_node', '2', '--standalone',
        'tests/helpers/microbatch_equivalence.py', out
    ])
    check_ok(proc)
    ranks = [json.load(open(osp.join(out, f'rank{r}.json'))) for r in (0, 1)]
    for rec in ranks:
        assert rec['moved'] > 1e-3  # training changed the weights at all
        assert rec['whole'] < 1e-6 and rec['split'] < 1e-6
        assert rec['loss'] < 1e-5  # logged loss is the batch mean
    assert ranks[0]['checksum'] == ranks[1]['checksum']


def _measured_peaks(tmp_path, cfg, opts, fresh=False):
    """What the finder's steps reach on this machine, measured now, in bytes
    (``tests/helpers/measure_trial_peaks.py``: its model built, its warm-up step, its trials
    at 2 and at 32 samples, and the process size where ``tests.helpers.limit_rank`` counts
    from)."""
    out = str(tmp_path / 'peaks.json')
    args = [out, '2', '32', cfg, '--work-dir', str(tmp_path / 'measure'), *opts]
    if fresh:  # for ranks started afresh
        check_ok(run([PYTHON, MEASURE, *args]))
    else:  # for ranks forked from the preloaded stack (_limited_run)
        (code, log), = start(args, str(tmp_path / 'measure_out'), script=MEASURE).wait()
        assert code == 0, log[-4000:]
    return json.load(open(out))


def _limited_run(cfg, work, opts, env, out_dir):
    """2 ranks by hand from the preloaded stack, as the trial peaks were measured (the limit
    counts from the same point of the same kind of process), the diagnosis after them as
    ``dist_train.sh`` runs it."""
    return dist_train([cfg, '--work-dir', work, *opts], 2, str(out_dir), env=env, diagnose=True)


def _measured_limits_mib(tmp_path, cfg, opts, fractions):
    """Limits for rank 1 at ``fractions`` of the way between what the finder's trial at 2
    and at 32 samples reach (after its warm-up step), measured now on this machine,
    counted from the process size where ``tests.helpers.limit_rank`` applies them."""
    peaks = _measured_peaks(tmp_path, cfg, opts)
    assert peaks['large'] > peaks['small'], peaks  # activations grow with the batch
    return [
        int((peaks['small'] + f * (peaks['large'] - peaks['small']) - peaks['at_import']) / 2**20)
        for f in fractions
    ]


def _found_batch_trains_or_nothing_fits(out: str, rc: int) -> str:
    """The promise: the run trains to its end, or stops before training with the one line
    that nothing fits; never an out-of-memory error after the finder said a batch fits."""
    if 'not even a per-device batch of 1 fits on rank(s) [1]' in out:
        assert rc != 0 and 'Epoch(train)' not in out and 'Traceback' not in out
        # every rank raised the same NothingFitsError, rank 0 first: the rank that ran out is
        # named, with its own memory
        diagnosis = out[out.index('==== mmddp_ext diagnosis'):]
        assert 'first failing rank: 1 ' in diagnosis and 'out of memory on rank 1' in diagnosis
        assert 'out of memory on rank 0' not in diagnosis, diagnosis
        return 'nothing fits'
    assert rc == 0, out[-3000:]
    found = int(re.search(r'batch probe: per-device batch (\d+) fits on every rank', out)[1])
    last = re.findall(r'Epoch\(train\) \[1\]\[(\d+)/(\d+)\]', out)[-1]
    assert last[0] == last[1]  # trained to the end of the epoch
    assert 'even with micro-batches of 1' not in out
    # training, after its first optimizer step, holds no more beyond the trials than they kept
    # free: the measurement covered what training holds
    assert f'the measurement of per-device batch {found} holds' in out, out[-3000:]
    return 'trained'


@pytest.mark.slow
def test_batch_probe_agrees_on_the_tightest_rank_and_is_reused(demo_data, tmp_path):
    """Rank 1's limit is placed at the midpoint between a trial at 2 and at 32 samples,
    measured on this machine: the ranks agree, rank 1 (only) is named, the found batch trains
    to the end, the result is reused. Then a quarter of the way, near the low end: the run
    trains to its end or stops before training with one line (never an out-of-memory error
    after "fits"). Above the midpoint there is more room than at it, which trained."""
    records = str(tmp_path / 'records')
    cfg = _config(tmp_path, records, ['limit_rank'])
    opts = _options(
        demo_data, 1, **{
            'scaling.global_batch_size': '64',
            'scaling.max_batch_per_device': 'auto',
            'scaling.memory_budget_mib': '100000'
        })
    middle, low = _measured_limits_mib(tmp_path, cfg, opts, (0.5, 0.25))
    work = str(tmp_path / 'w')
    env = {'MMDDP_TEST_LIMIT': f'1:{middle}'}  # rank 1 has less memory than the others
    proc = _limited_run(cfg, work, opts, env, tmp_path / 'ranks')
    out = proc.stdout
    assert _found_batch_trains_or_nothing_fits(out, proc.returncode) == 'trained'
    assert 'measuring host memory (CPU run, no GPU measured)' in out
    assert 'warm-up at per-device batch 1 fits on every rank' in out
    assert 'trial 1: per-device batch 32: out of memory on rank(s) [1] ' in out
    trials = re.findall(
        r'batch probe: trial \d+: per-device batch (\d+): (fits|out of memory '
        r'on rank\(s\) \[([\d, ]*)\])', out)
    assert 2 <= len(trials) <= math.ceil(math.log2(32)) + 1  # the bound docs/scaling.md gives
    assert all(ranks == '1' for _, verdict, ranks in trials if verdict != 'fits')
    found = int(re.search(r'batch probe: per-device batch (\d+) fits on every rank', out)[1])
    assert 1 <= found < 32
    assert max(int(b) for b, verdict, _ in trials if verdict == 'fits') == found
    assert min(int(b) for b, verdict, _ in trials if verdict != 'fits') == found + 1
    per_device, accumulation = (
        int(x) for x in re.search(r'per-GPU batch (\d+) × 2 GPUs × accumulation (\d+) = global 64',
                                  out).groups())
    assert per_device <= found and per_device * accumulation == 32
    assert 'training goes on with per-device batch' not in out  # the found batch just trains
    # the demo's BatchNorms train: a found batch below 8 is said to be the finder's choice
    finder_bn = (f'normalise over {per_device} sample(s) each step, below 8: their batch '
                 f'statistics are noisy and accuracy can drop (the batch finder chose '
                 f'per-device batch {per_device})')
    assert (finder_bn in out) == (per_device < 8), out[-4000:]
    recs = read_records(records)
    assert recs[0]['batch_sizes'] == recs[1]['batch_sizes'] and recs[0]['batch_sizes']
    assert set(recs[0]['batch_sizes']) == {per_device}
    assert recs[0]['param_checksum'] == pytest.approx(recs[1]['param_checksum'], rel=1e-9)
    stored = json.load(open(osp.join(work, 'batch_probe.json')))
    assert 'host memory' in stored['measured'] and stored['result']['max_batch'] == found

    again = check_ok(_limited_run(cfg, work, opts, env, tmp_path / 'ranks_again'))
    assert f'per-device batch {found} fits on every rank (measured before, read from' in again
    assert 'trial 1' not in again and 'warm-up' not in again

    proc = _limited_run(cfg, str(tmp_path / 'low'), opts, {'MMDDP_TEST_LIMIT': f'1:{low}'},
                        tmp_path / 'ranks_low')
    # the promise: it trains to its end, or stops before training with one line (near the low
    # end the warm-up with its reserve may not fit where training would)
    _found_batch_trains_or_nothing_fits(proc.stdout, proc.returncode)


@pytest.mark.slow
def test_a_finder_that_finds_nothing_names_the_rank_that_ran_out(demo_data, tmp_path):
    """Rank 1's limit lies halfway between the size of the finder's model and the peak of its
    warm-up step at one sample (measured now): the warm-up runs out of memory on rank 1 only.
    Every rank stops before training with the same one line (NothingFitsError), and the
    records and the diagnosis name rank 1 with its own memory, whichever rank wrote first."""
    cfg = _config(tmp_path, str(tmp_path / 'records'), ['limit_rank'])
    opts = _options(
        demo_data, 1, **{
            'scaling.global_batch_size': '64',
            'scaling.max_batch_per_device': 'auto',
            'scaling.memory_budget_mib': '100000'
        })
    # under dist_train.sh: its torchrun stops the other rank as it stops a job, and each rank
    # still writes its record (fresh processes, as the ranks)
    peaks = _measured_peaks(tmp_path, cfg, opts, fresh=True)
    assert peaks['warm_up'] > peaks['built'], peaks  # the warm-up step reached a new peak
    limit = int(((peaks['built'] + peaks['warm_up']) / 2 - peaks['at_import']) / 2**20)
    work = str(tmp_path / 'w')
    proc = run(['bash', 'tools/dist_train.sh', cfg, '2', '--work-dir', work, *opts],
               env={'MMDDP_TEST_LIMIT': f'1:{limit}'})
    out = proc.stdout
    assert _found_batch_trains_or_nothing_fits(out, proc.returncode) == 'nothing fits', peaks
    assert '(the warm-up step ran out of memory' in out
    records = {r['rank']: r for r in read_failure_records(work)}
    assert {r['exc_type'] for r in records.values()} == {'NothingFitsError'}
    assert records[0]['oom_ranks'] == records[1]['oom_ranks'] == [1]
    diagnosis = out[out.index('==== mmddp_ext diagnosis'):]
    assert 'rank 0 NothingFitsError (agreed to stop: it did not run out itself)' in diagnosis
    assert f'pid {records[1]["pid"]}' in diagnosis


@pytest.mark.slow
def test_training_that_holds_more_than_the_trials_kept_free_is_reported(demo_data, tmp_path):
    """Positive control of the finder's check: rank 1 holds 600 MiB from the start of
    training that the trials never held (more than the 300 MiB a 3000 MiB budget keeps free):
    the check says that the measurement was wrong there, and names rank 1 only."""
    cfg = _config(tmp_path, str(tmp_path / 'records'), ['hold_memory_hook'],
                  "dict(type='HoldMemoryHook', rank=1, mib=600)")
    opts = _options(demo_data, 1, slim=True, **{
        'scaling.max_batch_per_device': 'auto',
        'scaling.memory_budget_mib': '3000'
    })
    out = check_ok(
        dist_train([cfg, '--work-dir', str(tmp_path / 'w'), *opts], 2, str(tmp_path / 'ranks')))
    line = next(ln for ln in out.splitlines() if 'batch probe check:' in ln)
    assert 'the measurement was wrong on rank(s) [1]:' in line
    held = {int(r): int(m) for r, m in re.findall(r'rank (\d) (\d+) MiB of 300', line)}
    assert held[1] >= 600 > held[0]


@pytest.mark.slow
def test_agreed_out_of_memory_names_the_rank_that_ran_out(demo_data, tmp_path):
    """Rank 1 runs out of memory at every forward of one sample or more (torch's CPU
    allocator error, injected: a real limit leaves room that depends on what the process frees
    after it, so that micro-batches of 2 or 4 samples fitted in some runs and not in others):
    every rank redoes the step in ever smaller micro-batches, then both stop; the failure
    record and the diagnosis name rank 1, not the first rank to write. (The guard on a real
    allocator failure: the tests below and tests/memory/test_release_after_oom.py.)"""
    cfg = _config(tmp_path, str(tmp_path / 'records'), ['inject_oom'],
                  "dict(type='InjectOOMHook', rank=1, above=0)")
    work = str(tmp_path / 'w')
    proc = dist_train(
        [cfg, '--work-dir', work, *_options(demo_data, 1, **{'scaling.on_oom': 'microbatch'})], 2,
        str(tmp_path / 'ranks'), diagnose=True)
    assert proc.returncode != 0
    records = {r['rank']: r for r in read_failure_records(work)}
    assert records[0]['oom_ranks'] == records[1]['oom_ranks'] == [1]
    diagnosis = proc.stdout[proc.stdout.index('==== mmddp_ext diagnosis'):]
    assert 'first failing rank: 1 ' in diagnosis and 'out of memory on rank 1' in diagnosis
    assert 'rank 0 RanksOutOfMemoryError (agreed to stop: it did not run out itself)' in diagnosis
    assert f'pid {records[1]["pid"]}' in diagnosis


@pytest.mark.slow
def test_a_found_batch_that_runs_out_of_memory_in_training_steps_down(demo_data, tmp_path):
    """The finder says 16 fits (nothing is limited); training then runs out of memory on rank
    1 above 8 samples (injected): every rank splits, training goes on to the end, the stored
    result is corrected, and the next run plans 8 per device without any failure."""
    records = str(tmp_path / 'records')
    cfg = _config(tmp_path, records, ['inject_oom'], "dict(type='InjectOOMHook', rank=1, above=8)")
    work = str(tmp_path / 'w')
    opts = _options(
        demo_data, 1, slim=True, **{
            'scaling.max_batch_per_device': 'auto',
            'scaling.memory_budget_mib': '100000'
        })
    out = check_ok(dist_train([cfg, '--work-dir', work, *opts], 2, str(tmp_path / 'ranks1')))
    assert 'trial 1: per-device batch 16: fits on every rank' in out
    assert 'per-GPU batch 16 × 2 GPUs × accumulation 1 = global 32' in out
    assert out.count('out of memory on rank(s) [1] during a step') == 1
    assert ('training goes on with per-device batch 16 run as 2 micro-batches of at most 8 '
            'samples (global batch 32 and LR unchanged)') in out
    assert 'Epoch(train) [1][2/2]' in out
    recs = read_records(records)
    assert recs[0]['param_checksum'] == pytest.approx(recs[1]['param_checksum'], rel=1e-9)
    stored = json.load(open(osp.join(work, 'batch_probe.json')))
    assert stored['result']['max_batch'] == 8
    assert stored['corrections'][0]['found'] == 16 and stored['corrections'][0]['now'] == 8

    again = check_ok(dist_train([cfg, '--work-dir', work, *opts], 2, str(tmp_path / 'ranks2')))
    assert 'per-device batch 8 fits on every rank (measured before, read from' in again
    assert 'per-GPU batch 8 × 2 GPUs × accumulation 2 = global 32' in again
    assert 'during a step' not in again
    assert 'Epoch(train) [1][4/4]' in again  # 8 per device: 4 iterations


@pytest.mark.slow
def test_one_process_guards_the_found_batch_too(demo_data, tmp_path):
    """Without a launcher there is no DDP wrapper, yet the found batch is guarded the same
    way: MicrobatchDDP wraps the model in the single process."""
    records = str(tmp_path / 'records')
    cfg = _config(tmp_path, records, ['inject_oom'], "dict(type='InjectOOMHook', rank=0, above=16)")
    work = str(tmp_path / 'w')
    opts = _options(
        demo_data, 1, slim=True, **{
            'scaling.max_batch_per_device': 'auto',
            'scaling.memory_budget_mib': '100000'
        })
    out = check_ok(train([cfg, '--work-dir', work, *opts], str(tmp_path / 'out')))
    assert 'trial 1: per-device batch 32: fits on every rank' in out
    assert ('training goes on with per-device batch 32 run as 2 micro-batches of at most 16 '
            'samples') in out
    assert 'Epoch(train) [1][2/2]' in out
    assert json.load(open(osp.join(work, 'batch_probe.json')))['result']['max_batch'] == 16


@pytest.mark.slow
def test_a_real_out_of_memory_step_is_redone_as_micro_batches(demo_data, tmp_path):
    """Rank 1 measures what its step at per-device batch 16 allocates, then caps its address
    space at 3/4 of that (``LimitBelowStepHook``): its next step fails in torch's allocator
    for real. Every rank redoes it in smaller micro-batches, the split is kept (no level is
    announced twice), training reaches its end with the same global batch, and the replicas
    stay identical."""
    records = str(tmp_path / 'records')
    cfg = _config(tmp_path, records, ['limit_memory_hook'],
                  "dict(type='LimitBelowStepHook', rank=1, fraction=0.75, apply_after=2)")
    proc = dist_train([
        cfg, '--work-dir',
        str(tmp_path / 'w'), *_options(demo_data, 3, **{'scaling.on_oom': 'microbatch'})
    ], 2, str(tmp_path / 'ranks'))
    out = proc.stdout
    limited = out.find('LimitBelowStepHook: rank 1: a step allocates')
    check_ok(proc)
    assert limited >= 0, out[-4000:]
    assert 'per-GPU batch 16 × 2 GPUs × accumulation 1 = global 32' in out
    splits = [
        int(n) for n in re.findall(
            r'out of memory on rank\(s\) \[1\] during a step[^;]*; every rank redoes it as (\d+) '
            r'micro-batches per batch \(per-device batch 16\) with accumulation: global batch '
            r'and LR unchanged', out)
    ]
    assert splits, out[-4000:]
    assert re.search(r'during a step \(this rank: 16 samples up to \d+×\d+, 1 objects \(images \d+',
                     out), out[-4000:]  # what made the batch that ran out heavy
    assert out.index('out of memory on rank(s) [1] during a step') > limited  # after the cap
    assert splits == sorted(set(splits)) and splits[0] == 2  # halved, never redone at a level
    assert 'even with micro-batches of 1' not in out
    # the guard says when its micro-batches leave the demo's BatchNorms fewer than 8 samples
    # (the split training goes on with: the ScalingHook speaks after the iteration)
    size = math.ceil(16 / max(splits))
    said = f'normalise over {size} sample(s) each step, below 8' in out
    assert said == (size < 8), (splits, out[-4000:])
    assert 'Epoch(train) [3][2/2]' in out
    recs = read_records(records)
    assert recs[0]['batch_sizes'] == recs[1]['batch_sizes'] == [16] * 6
    # the gradients were averaged over both ranks: the replicas are still identical
    assert recs[0]['param_checksum'] == pytest.approx(recs[1]['param_checksum'], rel=1e-9)


def test_auto_on_cpu_without_budget_fails_before_training(demo_data, tmp_path):
    proc = train([
        DEMO_CONFIG, '--work-dir',
        str(tmp_path / 'w'), *demo_options(demo_data, 1, **{'scaling.max_batch_per_device': 'auto'})
    ], str(tmp_path / 'out'))
    assert proc.returncode != 0
    assert "scaling.max_batch_per_device='auto' on a CPU needs a memory budget" in proc.stdout
    assert 'scaling.memory_budget_mib=4096' in proc.stdout
    assert 'Traceback' not in proc.stdout
