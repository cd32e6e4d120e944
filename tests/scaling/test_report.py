"""Tests for :mod:`mmddp_ext.scaling.report`: the plan table of the log and of ``--explain``."""
from mmddp_ext.scaling.config import ScalingConfig
from mmddp_ext.scaling.plan import ConfigFacts, ScalingPlan, make_plan
from mmddp_ext.scaling.report import TITLE, plan_rows, plan_table

PLAN = make_plan(
    ScalingConfig(global_batch_size=512),
    ConfigFacts('td-hm_hrnet-w32_8xb64-210e_coco-256x192.py', 64, lrs=(5e-4, )), 2)


def _labels(table: str):
    return [
        line.split()[0] if not line.startswith('  learning') else 'learning'
        for line in table.splitlines()[1:]
    ]


def test_rows_hold_the_plan_its_changes_and_warnings():
    rows = dict(plan_rows(PLAN, ['train_dataloader.batch_size: 64 → 32']))
    # worked out from the case: 512 over 2 ranks at most 64 each is 64 × accumulation 4; the
    # facts carry no auto_scale_lr base, so none is known and the LR stays as written
    assert rows['plan'] == ('per-GPU batch 64 × 2 GPUs × accumulation 4 = global 512 (no base '
                            'batch size known) → LR × 1.0')
    assert rows['learning rates'] == '0.0005'
    assert rows['iterations'].startswith('× 4: 128 samples per iteration now, 512 as written')
    assert rows['changed'] == 'train_dataloader.batch_size: 64 → 32'


def test_table_puts_the_callers_rows_around_the_plan_and_changes_last():
    table = plan_table(PLAN, ['a: 1 → 2'], before=[('launch', 'L')], after=[('loop', 'P')],
                       warnings=['careful'])
    lines = table.splitlines()
    assert lines[0] == TITLE
    assert _labels(table) == [
        'launch', 'plan', 'mode', 'learning', 'iterations', 'loop', 'changed', 'warning'
    ]
    assert lines[-1].endswith('careful')
    assert len({line.index(line.split(None, 1)[0]) for line in lines[1:]}) == 1  # one indent
    assert len({len(line) - len(line.lstrip()) for line in lines[1:]}) == 1


def test_the_plan_survives_its_dict_form():
    assert ScalingPlan.from_dict(PLAN.to_dict()) == PLAN
    assert plan_table(ScalingPlan.from_dict(PLAN.to_dict())) == plan_table(PLAN)
