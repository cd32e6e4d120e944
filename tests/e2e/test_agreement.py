"""Every rank agrees before step 1, and a straggler is named: 2 real processes of the demo,
started by hand from the preloaded stack (`tests/preloaded.py`).

The config is the same on both ranks; what rank 1 builds from it differs (``rank_skew``
helpers): its dataset keeps fewer samples, or its model's head has one channel less; the job
must stop before the first iteration with one screen that names rank 1, the field and both
values. Then rank 1's data pipeline is slowed by a large factor of a measured iteration: the
warning must name rank 1 and ``data``. The healthy run is the control of the agreement: the ranks
agree, and the speed numbers are in the JSONL and the plot. (Whether a healthy run names no
straggler depends on the machine's load, so it is the pure tests' table that checks it, with
equal and noisy ranks, not a run here.)
"""
import glob
import json
import os.path as osp

import pytest

from mmddp_ext.diagnose.records import read_failures

from conftest import SLIM_HEAD_WIDTH, check_ok, demo_options, demo_with_hooks
from preloaded import dist_train

SCREEN = 25  # lines a user sees without scrolling


def _train(tmp_path, demo_data, hooks, *options, name, epochs=1, **extra):
    cfg = demo_with_hooks(tmp_path, hooks, ['rank_skew'], name)
    work = str(tmp_path / 'w')
    opts = demo_options(demo_data, epochs, **extra)
    proc = dist_train([cfg, '--work-dir', work, *opts, *options], 2, str(tmp_path / 'ranks'),
                      timeout=900)
    return proc, work


def _screen(out):
    """The agreement screen rank 0 logged (from its headline on)."""
    start = out.index('[mmddp_ext] ranks disagree before the first iteration')
    return '\n'.join(out[start:].splitlines()[:SCREEN])


@pytest.mark.slow
def test_rank1_with_fewer_samples_stops_the_job_before_step_1(demo_data, tmp_path):
    proc, work = _train(
        tmp_path, demo_data, "dict(type='RankMemoryHook', interval=1)", name='trimmed.py', **{
            'train_dataloader.dataset.type': 'RankTrimmedCocoDataset',
            'train_dataloader.dataset.keep': '16'
        })
    out = proc.stdout
    assert proc.returncode != 0, out[-4000:]
    assert 'Epoch(train)' not in out  # no iteration ran
    screen = _screen(out)
    assert 'rank 1 of 2 differs in dataset length, iterations per epoch' in ' '.join(screen.split())
    lines = screen.splitlines()
    length = lines.index('  dataset length:')
    assert lines[length + 1].split() == ['64', 'rank', '0']
    assert lines[length + 2].split()[:3] == ['16', 'rank', '1']
    assert 'fix: every rank must read the same annotation file' in screen
    # every rank stopped with the error, rank 0's record carries the screen (the diagnosis
    # reads these; it is not asserted on, as a gloo rank that raised may still crash at exit)
    records = {r['rank']: r for r in read_failures(work)}
    assert {
        r: rec['exc_type']
        for r, rec in records.items()
    } == {
        0: 'RanksDisagreeError',
        1: 'RanksDisagreeError'
    }
    assert '  dataset length:' in records[0]['message']
    assert "the table is in rank 0's log" in records[1]['message']


@pytest.mark.slow
def test_rank1_with_another_model_stops_the_job_with_the_parameters(demo_data, tmp_path):
    proc, _ = _train(tmp_path, demo_data, "dict(type='RankMemoryHook', interval=1)",
                     name='skewed.py', **{'model.type': 'RankSkewedPoseEstimator'})
    out = proc.stdout
    assert proc.returncode != 0, out[-4000:]
    assert 'Epoch(train)' not in out
    assert 'DDP expects same model across all processes' not in out  # ours came first
    screen = _screen(out)
    assert 'rank 1 of 2 differs in parameters' in ' '.join(screen.split())
    assert 'first differences, rank 0 vs rank 1:' in screen
    assert (f'head.final_layer.weight: (17, {SLIM_HEAD_WIDTH}, 1, 1) vs '
            f'(16, {SLIM_HEAD_WIDTH}, 1, 1)') in screen
    assert 'head.final_layer.bias: (17) vs (16)' in screen
    assert 'fix: every rank must build the same model' in screen


def _speed(work):
    [log_dir] = glob.glob(osp.join(work, '2*'))
    return log_dir, {
        rank: [json.loads(x) for x in open(osp.join(log_dir, 'memory', f'rank{rank}.jsonl'))]
        for rank in (0, 1)
    }


def test_healthy_run_agrees_and_records_speed(healthy_run):
    """The shared healthy run (``conftest.healthy_run``: 1 epoch of 2 iterations,
    ``RankMemoryHook(interval=1)``)."""
    out = healthy_run.out
    assert '[mmddp_ext] 2 ranks agree: dataset length 64, 2 iterations per epoch' in out
    assert 'starting at epoch 0, iteration 0' in out
    assert 'ranks disagree' not in out
    log_dir, lines = _speed(healthy_run.work)
    for rank in (0, 1):
        timed = [s for s in lines[rank] if s['timed_iters']]
        assert timed and all(s['iter_time_s'] >= s['data_time_s'] >= 0 for s in timed)
        assert all(s['iter_time_s'] >= s['forward_time_s'] > 0 for s in timed)
    assert osp.getsize(osp.join(log_dir, 'memory', 'speed.png')) > 1000


@pytest.mark.slow
def test_a_rank_with_a_slow_loader_is_named_as_data(demo_data, tmp_path):
    """Rank 1's loader sleeps 3 of its iterations per batch from iteration 4 on (the first ones
    measure it); samples at iterations 1, 2, 4, 6, 8. Patience 3: the two samples before the
    sleep are single iterations, where a loaded machine once made rank 0's loading look slow
    twice in a row; three in a row it can only be rank 1, from the first sample with the
    sleep to the last."""
    proc, work = _train(
        tmp_path, demo_data, "dict(type='RankMemoryHook', interval=2, straggler_patience=3), "
        "dict(type='SlowDataHook', rank=1, factor=3, warmup=2)", name='slow.py', epochs=2,
        **{'train_dataloader.batch_size': '8'})
    out = check_ok(proc)
    assert 'SlowDataHook: rank 1 sleeps' in out
    warnings = [line for line in out.splitlines() if '[mmddp_ext speed] straggler:' in line]
    assert warnings, out[-5000:]
    # rank 1 is named for its data; a busy machine may also slow a rank's forward pass for real,
    # so a compute warning is allowed, but no other rank is named for its data
    data = [w for w in warnings if 'waiting for its batches (data loading)' in w]
    assert len(data) == 1 and 'straggler: rank 1 (host ' in data[0], warnings
    assert 'slow in 3 samples in a row' in data[0]
    _, lines = _speed(work)
    last = lines[1][-1], lines[0][-1]
    # 3 iterations' worth of sleep per batch on rank 1: its data time is the iteration's bulk
    assert last[0]['data_time_s'] > 0.5 * last[0]['iter_time_s']
    assert last[0]['data_time_s'] > 3 * last[1]['data_time_s']
