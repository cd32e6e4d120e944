"""entry/forecast: what ``--explain --memory`` plans for on this host before it measures: the
device memory (given, or read), and the memory other processes hold (none on a CPU). The whole
forecast, measured on the demo: tests/e2e/test_explain_memory.py."""
import pytest
import torch

from mmddp_ext.entry import forecast
from mmddp_ext.memory.forecast import ForecastError
from mmddp_ext.utils.memory_reads import host_memory_bytes

CPU = torch.device('cpu')


def test_a_given_device_memory_wins():
    assert forecast._device_memory('24GiB', CPU, 2) == (24 * 1024.0, '--device-memory 24GiB')


def test_a_bad_device_memory_is_named():
    with pytest.raises(ForecastError, match="--device-memory='lots'"):
        forecast._device_memory('lots', CPU, 2)


@pytest.mark.parametrize('ranks', [1, 2, 4])
def test_on_a_cpu_the_ranks_of_a_node_share_its_ram(ranks):
    mib, how = forecast._device_memory(None, CPU, ranks)
    assert mib == pytest.approx(host_memory_bytes() / 2**20 / ranks)
    assert f'shared by {ranks} rank(s)' in how


def test_a_cpu_has_no_stray_contexts():
    cause = forecast._stray(CPU, 2)
    assert cause.mib == 0.0 and 'no GPU' in cause.how
