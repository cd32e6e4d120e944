"""Multi-node failures under a real local Slurm cluster (tests/slurm/cluster.py): a task that
dies under ``srun --kill-on-bad-exit`` is named by the diagnosis with its node and rank, although
no launcher reports who died (torchrun does; srun does not)."""
import os.path as osp

import pytest

from conftest import DEMO_CONFIG, PYTHON, demo_options, run
from rank_screens import assert_killed_screen, assert_raise_screens, fault_config

pytestmark = pytest.mark.slow


def test_a_task_killed_on_one_node_is_named_with_its_node(slurm, demo_data, tmp_path):
    work = str(tmp_path / 'w')
    cfg = tmp_path / 'kill.py'
    cfg.write_text(f'_base_ = [{DEMO_CONFIG!r}]\n'
                   "custom_imports = dict(imports=['mmddp_ext', 'tests.helpers.fault_hook'], "
                   'allow_failed_imports=False)\n'
                   "custom_hooks = [dict(type='FaultHook', rank=1, at_iter=2, fault='sigkill')]\n")
    proc = run([
        'srun', '-N2', '--ntasks-per-node=1', '--kill-on-bad-exit=1', PYTHON, 'tools/dist_train.py',
        str(cfg), '--launcher', 'slurm', '--work-dir', work, *demo_options(demo_data, 1)
    ], env=dict(SLURM_CONF=slurm.conf))
    assert proc.returncode != 0
    assert osp.isfile(osp.join(work, 'fault_rank1.json'))  # the fault happened, on rank 1
    text = run([PYTHON, '-m', 'mmddp_ext.diagnose', work]).stdout
    assert 'rank 1 (node n2, pid ' in text, text
    assert 'died without a Python exception after iteration 1' in text, text
    assert 'first failing rank: 0' not in text


@pytest.mark.parametrize('fault', ['raise', 'sigkill'])
def test_a_failed_rank_under_srun_prints_its_screen(slurm, demo_data, tmp_path, fault):
    """srun prints no diagnosis: a rank that raised shows its error and the command for the
    whole job, and rank 0 names the peer it lost and what that peer left
    (tests/e2e/test_rank_screens.py)."""
    work = str(tmp_path / 'w')
    proc = run([
        'srun', '-N2', '--ntasks-per-node=1', PYTHON, 'tools/dist_train.py',
        fault_config(tmp_path, fault), '--launcher', 'slurm', '--work-dir', work,
        *demo_options(demo_data, 2)
    ], env=dict(SLURM_CONF=slurm.conf))
    assert proc.returncode != 0
    (assert_raise_screens if fault == 'raise' else assert_killed_screen)(proc.stdout, work)
