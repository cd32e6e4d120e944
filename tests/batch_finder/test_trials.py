"""batch_finder/trials: what a trial keeps free. The trials themselves, on real ranks under a
real memory budget: tests/e2e/test_oom_handling.py and tests/batch_finder/test_search.py."""
import pytest

from mmddp_ext.batch_finder.trials import CPU_RESERVE_MIB, reserve_bytes
from mmddp_ext.memory.budget import MARGIN, Budget

MIB = 2**20


@pytest.mark.parametrize(
    'device, budget_mib, reserve_mib',
    [
        ('cuda:0', 10000, 1000),  # a GPU: the margin of the budget
        ('cuda:1', 500, 50),  # however small
        ('cpu', 10000, 1000),  # a CPU: the margin, when it is more than what the Runner adds
        ('cpu', 1000, CPU_RESERVE_MIB),  # at least what the Runner adds beside the model
    ])
def test_what_a_trial_keeps_free(device, budget_mib, reserve_mib):
    assert MARGIN == 0.1  # the table's numbers
    assert reserve_bytes(Budget(device, budget_mib * MIB, 'test')) == reserve_mib * MIB
