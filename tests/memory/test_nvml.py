"""Tests of :mod:`mmddp_ext.memory.nvml`: recorded tables, index mapping, the live reader."""
import json
import os.path as osp
import socket
import subprocess
import sys
import types

import pytest

from mmddp_ext.gpu import use_gpus
from mmddp_ext.gpu.cuda import CudaGpus
from mmddp_ext.memory.nvml import (NvmlProcessTableReader, ProcessTableReader,
                                   RecordedProcessTableReader, physical_device_index)
from mmddp_ext.memory.stray import DeviceTable, GpuProcess, RankIdentity, find_stray

GIB = 2**30
PACKAGE_DIR = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))) + '/mmddp_ext'

RECORDING = {
    'host':
    'node1',
    'devices': [
        {
            'index':
            0,
            'total_bytes':
            int(23.64 * GIB),
            'processes': [{
                'pid': 727401,
                'used_bytes': int(21.5 * GIB)
            }, {
                'pid': 727402,
                'used_bytes': int(1.89 * GIB)
            }]
        },
        {
            'index': 1,
            'total_bytes': int(23.64 * GIB),
            'processes': [{
                'pid': 727402,
                'used_bytes': None
            }]
        },
    ],
}


def test_modules_import_neither_pynvml_nor_torch():
    # A bare parent package, so that only mmddp_ext.memory itself is imported.
    code = ('import sys, types; pkg = types.ModuleType("mmddp_ext"); '
            f'pkg.__path__ = [{PACKAGE_DIR!r}]; sys.modules["mmddp_ext"] = pkg; '
            'import mmddp_ext.memory; '
            'assert "pynvml" not in sys.modules and "torch" not in sys.modules, '
            'sorted(m for m in sys.modules if m.split(".")[0] in ("pynvml", "torch"))')
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_recorded_round_trip_into_find_stray():
    reader = RecordedProcessTableReader.from_dict(json.loads(json.dumps(RECORDING)))
    assert isinstance(reader, ProcessTableReader)
    assert reader.read(1) == DeviceTable('node1', 1, int(23.64 * GIB), (GpuProcess(727402, None), ))
    assert reader.to_dict() == RECORDING
    ranks = [RankIdentity(0, 'node1', 727401, 0), RankIdentity(1, 'node1', 727402, 1)]
    [f] = find_stray(ranks, [reader.read(i) for i in (0, 1)])
    assert (f.kind, f.rank, f.pid, f.device_index) == ('cross_rank', 1, 727402, 0)
    assert '1.89 GiB' in f.message


def test_missing_used_bytes_is_unknown():
    data = {'host': 'h', 'devices': [{'index': 3, 'total_bytes': 10, 'processes': [{'pid': 1}]}]}
    assert RecordedProcessTableReader.from_dict(data).read(3).processes == (GpuProcess(1, None), )


def test_missing_index_names_index_and_recorded_ones():
    reader = RecordedProcessTableReader.from_dict(RECORDING)
    with pytest.raises(ValueError, match=r'GPU 5.*\[0, 1\]'):
        reader.read(5)


@pytest.mark.parametrize('data, match', [
    ({
        'devices': []
    }, "'host'"),
    ({
        'host': 'h'
    }, "'devices'"),
    ({
        'host': 'h',
        'devices': [{
            'total_bytes': 1,
            'processes': []
        }]
    }, "'index'"),
    ({
        'host': 'h',
        'devices': [{
            'index': 0,
            'processes': []
        }]
    }, "'total_bytes'"),
    ({
        'host': 'h',
        'devices': [{
            'index': 0,
            'total_bytes': 1,
            'processes': [{}]
        }]
    }, "'pid'"),
    ({
        'host':
        'h',
        'devices': [{
            'index': 0,
            'total_bytes': 1,
            'processes': []
        }, {
            'index': 0,
            'total_bytes': 1,
            'processes': []
        }]
    }, 'device 0 is recorded more than once'),
])
def test_from_dict_errors_name_the_problem(data, match):
    with pytest.raises(ValueError, match=match):
        RecordedProcessTableReader.from_dict(data)


def test_recorded_table_under_wrong_index_is_rejected():
    with pytest.raises(ValueError, match='index 2 describes device 0'):
        RecordedProcessTableReader({2: DeviceTable('h', 0, 1, ())})


@pytest.mark.parametrize('local, visible, physical', [
    (0, None, 0),
    (3, None, 3),
    (1, '', 1),
    (1, '   ', 1),
    (0, '0,1', 0),
    (1, '0,1', 1),
    (0, '2,3', 2),
    (1, '2,3', 3),
    (1, ' 2, 3 ', 3),
    (0, '7', 7),
])
def test_physical_device_index(local, visible, physical):
    assert physical_device_index(local, visible) == physical


@pytest.mark.parametrize('local, visible, match', [
    (0, 'GPU-abc', 'GPU-abc'),
    (1, '0,GPU-8f1c', 'GPU-8f1c'),
    (0, 'MIG-xyz', 'MIG-xyz'),
    (2, '2,3', 'index 2 .*2,3'),
    (0, 'a,b', "'a'"),
    (0, '0,,1', "''"),
    (-1, '0,1', '-1'),
])
def test_physical_device_index_errors(local, visible, match):
    with pytest.raises(ValueError, match=match):
        physical_device_index(local, visible)


def test_available_is_false_without_pynvml_and_never_raises(monkeypatch):
    """No ``pynvml`` installed (its import fails): not available, no ImportError. The True
    side is the fake NVML's test below."""
    monkeypatch.setitem(sys.modules, 'pynvml', None)  # ``import pynvml`` raises ImportError
    previous = use_gpus(CudaGpus())
    try:
        assert NvmlProcessTableReader.available() is False
        with pytest.raises(RuntimeError, match='node1'):
            NvmlProcessTableReader('node1').read(0)
    finally:
        use_gpus(previous)


def test_available_says_whether_a_real_read_works():
    """On this host, whatever it has: available() is True exactly when reading GPU 0's table
    through NVML works."""
    previous = use_gpus(CudaGpus())
    try:
        available = NvmlProcessTableReader.available()
        try:
            NvmlProcessTableReader('here').read(0)
            read = True
        except RuntimeError:
            read = False
    finally:
        use_gpus(previous)
    assert available is read


def test_reader_defaults_host_to_hostname():
    assert NvmlProcessTableReader().host == socket.gethostname()
    assert NvmlProcessTableReader('node7').host == 'node7'


class FakeNvml:
    """Stands in for the ``pynvml`` module: two devices, counts init/shutdown calls."""

    class NVMLError(Exception):
        pass

    def __init__(self):
        self.inits = 0
        self.shutdowns = 0

    def nvmlInit(self):
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetHandleByIndex(self, index):
        if index > 1:
            raise self.NVMLError('Invalid Argument')
        return f'handle{index}'

    def nvmlDeviceGetMemoryInfo(self, handle):
        return types.SimpleNamespace(total=80 * GIB if handle == 'handle0' else 40 * GIB)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        rows = {'handle0': [(11, 5 * GIB), (12, None), (13, 2**64 - 1)], 'handle1': []}
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in rows[handle]]


def test_nvml_reader_maps_pynvml_rows(monkeypatch):
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, 'pynvml', fake)
    previous = use_gpus(CudaGpus())
    try:
        reader = NvmlProcessTableReader('node1')
        assert fake.inits == 0  # nothing before the first read
        assert reader.read(0) == DeviceTable(
            'node1', 0, 80 * GIB,
            (GpuProcess(11, 5 * GIB), GpuProcess(12, None), GpuProcess(13, None)))
        assert reader.read(1) == DeviceTable('node1', 1, 40 * GIB, ())
        with pytest.raises(RuntimeError, match='host node1: NVML could not read GPU 2: Invalid'):
            reader.read(2)
        assert fake.inits == fake.shutdowns == 3  # each read opens and closes NVML
        assert NvmlProcessTableReader.available() is True
    finally:
        use_gpus(previous)


def test_nvml_init_failure_is_runtime_error_and_not_available(monkeypatch):
    fake = FakeNvml()

    def fail():
        raise fake.NVMLError('Driver Not Loaded')

    fake.nvmlInit = fail
    monkeypatch.setitem(sys.modules, 'pynvml', fake)
    previous = use_gpus(CudaGpus())
    try:
        assert NvmlProcessTableReader.available() is False
        with pytest.raises(RuntimeError, match='host node1: nvmlInit failed: Driver Not Loaded'):
            NvmlProcessTableReader('node1').read(0)
    finally:
        use_gpus(previous)


@pytest.mark.skipif(NvmlProcessTableReader.available(), reason='a GPU and driver are present')
def test_reader_without_driver_raises_runtime_error():
    with NvmlProcessTableReader('node1') as reader:
        with pytest.raises(RuntimeError, match='node1|pynvml'):
            reader.read(0)


@pytest.mark.skipif(not NvmlProcessTableReader.available(), reason='needs an NVIDIA GPU and driver')
def test_real_reader_reads_device_zero():
    with NvmlProcessTableReader('here') as reader:
        first = reader.read(0)
        with pytest.raises(RuntimeError, match='GPU 10000'):
            reader.read(10000)
    assert (first.host, first.device_index) == ('here', 0)
    assert first.total_bytes > 2**30
    assert all(p.pid > 0 for p in first.processes)
    assert all(p.used_bytes is None or p.used_bytes >= 0 for p in first.processes)
    assert isinstance(reader, ProcessTableReader)
