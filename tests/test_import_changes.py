"""``import mmddp_ext`` changes in MMEngine, the environment, the warning filters and the
collector exactly what ``mmddp_ext.import_changes`` lists, and a stock ``Runner`` (MMEngine's
toy runner, no ``runner_type``) trains the same with and without it: same runner, loop, hooks
and final weights. Each in a fresh process (``tests.helpers.import_probe``)."""
import json

import pytest

from mmddp_ext.import_changes import IMPORT_CHANGES

from conftest import PYTHON, check_ok, run


def _probe(*args: str) -> dict:
    out = check_ok(run([PYTHON, '-m', 'tests.helpers.import_probe', *args], timeout=300))
    return json.loads(out.strip().splitlines()[-1])


def test_importing_changes_only_what_is_listed():
    changed = _probe('changes')
    assert changed == dict(runner=['__init__', '_mmddp_ext_honours_runner_type', 'from_cfg'],
                           loaders=[''], packages=['mmddp_ext'], environ=[], filters=[], gc=[])
    listed = ' '.join(change.what for change in IMPORT_CHANGES)
    for name in ('Runner.from_cfg', 'Runner.__init__', 'CheckpointLoader', 'MODULE2PACKAGE'):
        assert name in listed


@pytest.mark.slow
def test_a_stock_runner_trains_the_same_with_and_without_the_import():
    without, with_ = _probe('train', 'without'), _probe('train', 'with')
    assert with_['type'] == 'Runner' and with_['loop'] == 'EpochBasedTrainLoop'
    assert with_ == without
