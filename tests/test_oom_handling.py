"""Batch finding (``max_batch_per_device='auto'``) and ``on_oom='microbatch'`` with real
out-of-memory errors: 2 gloo processes, one of them under a tighter address-space limit, on
the demo at 128×128 input (activations grow with the batch enough to matter on a CPU)."""
import json
import os.path as osp
import re

import pytest

from conftest import DEMO_CONFIG, PYTHON, ROOT, check_ok, demo_options, read_records, run

DEMO_128 = osp.join(ROOT, 'configs', 'demo', 'td-hm_res18_1xb32-30e_demo-128x128.py')


def _config(tmp_path, record_dir, modules=(), hooks=''):
    imports = ['mmddp_ext', 'tests.helpers.rank_record_hook'] + [
        f'tests.helpers.{m}' for m in modules]
    hook_list = f"[dict(type='RankRecordHook', out_dir={record_dir!r}), {hooks}]"
    path = osp.join(str(tmp_path), 'demo128.py')
    with open(path, 'w') as f:
        f.write(f'_base_ = [{DEMO_128!r}]\n'
                f'custom_imports = dict(imports={imports!r}, allow_failed_imports=False)\n'
                f'custom_hooks = {hook_list}\n')
    return path


def _options(demo_data, epochs, **extra):
    # no validation (its batch is not probed) and no final checkpoint: training only
    return demo_options(demo_data, epochs, **{'train_cfg.val_begin': str(epochs + 1),
                                              'default_hooks.checkpoint.save_last': 'False',
                                              **extra})


@pytest.mark.slow
def test_microbatch_step_equals_ddp_step(tmp_path):
    """MicrobatchDDP (whole and split in 3) against MMEngine's DDP, accumulation 2, different
    data per rank, a model without batch statistics: the same weights."""
    out = str(tmp_path / 'eq')
    proc = run([PYTHON, '-m', 'torch.distributed.run', '--nproc_per_node', '2',
                '--standalone', 'tests/helpers/microbatch_equivalence.py', out])
    check_ok(proc)
    ranks = [json.load(open(osp.join(out, f'rank{r}.json'))) for r in (0, 1)]
    for rec in ranks:
        assert rec['moved'] > 1e-3                  # training changed the weights at all
        assert rec['whole'] < 1e-6 and rec['split'] < 1e-6
        assert rec['loss'] < 1e-5                   # logged loss is the batch mean
    assert ranks[0]['checksum'] == ranks[1]['checksum']


@pytest.mark.slow
def test_batch_probe_agrees_on_the_tightest_rank_and_is_reused(demo_data, tmp_path):
    records = str(tmp_path / 'records')
    cfg = _config(tmp_path, records, ['limit_rank'])
    work = str(tmp_path / 'w')
    opts = _options(demo_data, 1, **{'scaling.global_batch_size': '64',
                                     'scaling.max_batch_per_device': 'auto',
                                     'scaling.memory_budget_mib': '3000'})
    env = {'MMDDP_TEST_LIMIT': '1:1030'}  # rank 1 has less memory than the others
    out = check_ok(run(['bash', 'tools/dist_train.sh', cfg, '2', '--work-dir', work, *opts],
                       env=env))
    assert 'measuring host memory (CPU run, no GPU measured)' in out
    assert 'at most 6 trials' in out
    assert 'trial 1: per-device batch 32: out of memory on rank(s) [1] ' in out
    trials = re.findall(r'batch probe: trial (\d+): per-device batch (\d+): (fits|out)', out)
    assert 2 <= len(trials) <= 6
    found = int(re.search(r'batch probe: per-device batch (\d+) fits on every rank', out)[1])
    assert 1 <= found < 32
    assert max(int(b) for _, b, verdict in trials if verdict == 'fits') == found
    per_device, accumulation = (int(x) for x in re.search(
        r'per-GPU batch (\d+) × 2 GPUs × accumulation (\d+) = global 64', out).groups())
    assert per_device <= found and per_device * accumulation == 32
    recs = read_records(records)
    assert set(recs[0]['batch_sizes']) == set(recs[1]['batch_sizes']) == {per_device}
    stored = json.load(open(osp.join(work, 'batch_probe.json')))
    assert stored['result']['max_batch'] == found and 'host memory' in stored['measured']

    again = check_ok(run(['bash', 'tools/dist_train.sh', cfg, '2', '--work-dir', work, *opts],
                         env=env))
    assert f'per-device batch {found} fits on every rank (measured before, read from' in again
    assert 'trial 1' not in again
    assert f'per-GPU batch {per_device} × 2 GPUs × accumulation {accumulation}' in again


@pytest.mark.slow
def test_out_of_memory_step_is_redone_as_micro_batches(demo_data, tmp_path):
    """After one step (optimizer state and kernels in place) rank 1 gets 100 MiB: a step at
    per-device batch 16 no longer fits there, 2 micro-batches of 8 do."""
    records = str(tmp_path / 'records')
    cfg = _config(tmp_path, records, ['limit_memory_hook'],
                  "dict(type='LimitAddressSpaceHook', rank=1, budget_mib=100, after_iters=1)")
    out = check_ok(run(['bash', 'tools/dist_train.sh', cfg, '2', '--work-dir',
                        str(tmp_path / 'w'),
                        *_options(demo_data, 2, **{'scaling.on_oom': 'microbatch'})]))
    assert 'per-GPU batch 16 × 2 GPUs × accumulation 1 = global 32' in out
    redo = ('out of memory on rank(s) [1] during a step; every rank redoes it as 2 '
            'micro-batches per batch (per-device batch 16) with accumulation: global batch '
            'and LR unchanged')
    assert out.count(redo) == 1                       # and it stays split afterwards
    assert 'as 4 micro-batches' not in out
    assert 'Epoch(train) [2][2/2]' in out
    recs = read_records(records)
    assert recs[0]['batch_sizes'] == recs[1]['batch_sizes'] == [16, 16, 16, 16]
    # the gradients were averaged over both ranks: the replicas are still identical
    assert recs[0]['param_checksum'] == pytest.approx(recs[1]['param_checksum'], rel=1e-9)


def test_auto_on_cpu_without_budget_fails_before_training(demo_data, tmp_path):
    proc = run([PYTHON, 'tools/dist_train.py', DEMO_CONFIG, '--work-dir', str(tmp_path / 'w'),
                *demo_options(demo_data, 1, **{'scaling.max_batch_per_device': 'auto'})])
    assert proc.returncode != 0
    assert "scaling.max_batch_per_device='auto' on a CPU needs a memory budget" in proc.stdout
    assert 'scaling.memory_budget_mib=4096' in proc.stdout
    assert 'Traceback' not in proc.stdout
