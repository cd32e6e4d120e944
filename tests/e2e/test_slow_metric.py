"""Rank 0's metric takes twice the collective timeout (``env_cfg.dist_cfg.timeout``): the
demo, 2 processes under ``bash tools/dist_train.sh``, validating after each of its 2 epochs with
its own DataLoader workers, trains through both validations, and rank 0 says meanwhile how long
it has computed. Before ``PatientEvaluator`` the waiting rank died in the first validation."""
import os.path as osp
import re

import pytest

from conftest import DEMO_CONFIG, DEMO_WORKERS, check_ok, demo_options, run

COLLECTIVE_TIMEOUT = 20  # seconds: what the users set to see hangs early
BUSY = 2 * COLLECTIVE_TIMEOUT


def _config(tmp_path) -> str:
    path = str(tmp_path / 'slow_metric.py')
    with open(path, 'w') as f:
        f.write(f'_base_ = [{DEMO_CONFIG!r}]\n'
                "custom_imports = dict(imports=['mmddp_ext', 'tests.helpers.slow_metric'], "
                'allow_failed_imports=False)\n')
    return path


@pytest.mark.slow
@pytest.mark.waits
def test_a_metric_slower_than_the_collective_timeout_trains_through(demo_data, tmp_path):
    work = str(tmp_path / 'w')
    opts = demo_options(
        demo_data, 2, validate=True, **DEMO_WORKERS, **{
            'train_cfg.val_interval': '1',
            'val_evaluator.type': 'SlowCocoMetric',
            'val_evaluator.busy': str(BUSY),
            'env_cfg.dist_cfg.timeout': str(COLLECTIVE_TIMEOUT),
            'default_hooks.hang_watchdog.report_every': '5',
        })
    out = check_ok(
        run(['bash', 'tools/dist_train.sh',
             _config(tmp_path), '2', '--work-dir', work, *opts], timeout=900))
    validated = re.findall(r'Epoch\(val\) \[(\d+)\].*coco/AP: ', out)
    assert validated == ['1', '2'], out[-4000:]
    assert osp.isfile(osp.join(work, 'epoch_2.pth'))
    # rank 0 said how long it had computed, past the collective timeout, and who waited
    said = [float(s) for s in re.findall(r'rank 0 has computed the val metrics for (\d+) s', out)]
    assert max(said) > COLLECTIVE_TIMEOUT, out[-4000:]
    assert '1 other rank waits for them' in out


@pytest.mark.slow
@pytest.mark.waits
def test_a_stuck_metric_is_named_with_the_bound_to_raise(demo_data, tmp_path):
    """The metric never ends: rank 0's watchdog stops it at ``metric_timeout``, and the last
    screen names rank 0 in the metric, the rank that waited, and the bound to raise."""
    opts = demo_options(
        demo_data, 1, validate=True, **{
            'val_evaluator.type': 'SlowCocoMetric',
            'val_evaluator.busy': str(10**6),
            'default_hooks.hang_watchdog.metric_timeout': '15',
            'default_hooks.hang_watchdog.report_every': '5',
        })
    proc = run([
        'bash', 'tools/dist_train.sh',
        _config(tmp_path), '2', '--work-dir',
        str(tmp_path / 'w'), *opts
    ], timeout=600)
    assert proc.returncode != 0
    screen = ' '.join('\n'.join(proc.stdout.rstrip().splitlines()[-12:]).split())
    assert 'hang: no progress for 15 s (hang watchdog)' in screen, proc.stdout[-5000:]
    assert 'rank 0 did not arrive; it was in' in screen and 'in compute_metrics' in screen
    assert 'slow_metric.py' in screen
    assert 'rank 1 waited in a collective' in screen
    assert ('fix: rank 0 was computing the val metrics when its bound ran out' in screen
            and 'metric_timeout=<seconds>' in screen)
    assert re.search(r'rank 0 has computed the val metrics for \d+ s \(CPU', proc.stdout)
