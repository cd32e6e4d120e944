"""Read NVML's per-process table of a device, live or from a recording.

:class:`NvmlProcessTableReader` asks this process's GPUs (:func:`mmddp_ext.gpu.gpus`: the
driver through ``pynvml``, or the test suite's fake host), so importing this module never
needs a GPU or a driver. :class:`RecordedProcessTableReader` replays tables recorded as JSON,
for tests and for analysing a run after the fact.

NVML numbers devices physically (as ``nvidia-smi`` does), while torch numbers the devices left
visible by ``CUDA_VISIBLE_DEVICES``; :func:`physical_device_index` maps one to the other.
"""
import socket
from typing import Any, Dict, Mapping, Optional, Protocol, runtime_checkable

from ..gpu import gpus, physical_device_index
from .stray import DeviceTable, GpuProcess


@runtime_checkable
class ProcessTableReader(Protocol):
    """Anything that returns the process table of a device by its physical index."""

    def read(self, device_index: int) -> DeviceTable:
        """The process table of the device with physical (NVML) index ``device_index``."""
        ...


class NvmlProcessTableReader:
    """Reads process tables from NVML, through this process's GPUs.

    Attributes:
        host: Host name put into every table read.
    """

    def __init__(self, host: Optional[str] = None) -> None:
        self.host: str = host if host is not None else socket.gethostname()

    def __enter__(self) -> 'NvmlProcessTableReader':
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    @staticmethod
    def available() -> bool:
        """True when NVML's tables can be read; never raises."""
        return gpus().nvml_available()

    def read(self, device_index: int) -> DeviceTable:
        """The process table of the device with physical (NVML) index ``device_index``.

        Raises:
            RuntimeError: If NVML is missing or fails for this device.
        """
        try:
            total, rows = gpus().process_table(device_index)
        except RuntimeError as exc:
            raise RuntimeError(f'host {self.host}: {exc}') from exc
        processes = tuple(GpuProcess(pid, used) for pid, used in rows)
        return DeviceTable(self.host, device_index, total, processes)

    def close(self) -> None:
        """Nothing to release: each read opens and closes NVML."""


class RecordedProcessTableReader:
    """Replays recorded process tables.

    Attributes:
        tables: The recorded tables by physical device index.
    """

    def __init__(self, tables: Mapping[int, DeviceTable]) -> None:
        for index, table in tables.items():
            if table.device_index != index:
                raise ValueError(f'table recorded under index {index} describes device '
                                 f'{table.device_index}')
        self.tables: Dict[int, DeviceTable] = dict(tables)

    def read(self, device_index: int) -> DeviceTable:
        """The recorded table of ``device_index``.

        Raises:
            ValueError: If no table was recorded for ``device_index``.
        """
        try:
            return self.tables[device_index]
        except KeyError:
            raise ValueError(f'no process table recorded for GPU {device_index}; recorded: '
                             f'{sorted(self.tables)}') from None

    @classmethod
    def from_dict(cls, data: Mapping) -> 'RecordedProcessTableReader':
        """Build a reader from ``{"host": ..., "devices": [{"index", "total_bytes",
        "processes": [{"pid", "used_bytes"}]}]}`` (``used_bytes`` may be null or missing).

        Raises:
            ValueError: If a required key is missing or a device index is repeated.
        """
        host = str(_require(data, 'host', 'recording'))
        tables: Dict[int, DeviceTable] = {}
        for device in _require(data, 'devices', 'recording'):
            table = _table_from_dict(host, device)
            if table.device_index in tables:
                raise ValueError(f'device {table.device_index} is recorded more than once')
            tables[table.device_index] = table
        return cls(tables)

    def to_dict(self) -> Dict[str, Any]:
        """The recording in the shape :meth:`from_dict` reads.

        Raises:
            ValueError: If the tables come from more than one host, or there are none.
        """
        hosts = sorted({t.host for t in self.tables.values()})
        if len(hosts) != 1:
            raise ValueError(f'a recording holds the tables of exactly one host, got {hosts}')
        devices = [{
            'index': t.device_index,
            'total_bytes': t.total_bytes,
            'processes': [{
                'pid': p.pid,
                'used_bytes': p.used_bytes
            } for p in t.processes]
        } for _, t in sorted(self.tables.items())]
        return {'host': hosts[0], 'devices': devices}


def _table_from_dict(host: str, device: Mapping) -> DeviceTable:
    index = _require(device, 'index', 'device')
    where = f'device {index}'
    processes = tuple(
        GpuProcess(_require(p, 'pid', f'process of {where}'), p.get('used_bytes'))
        for p in _require(device, 'processes', where))
    return DeviceTable(host, index, _require(device, 'total_bytes', where), processes)


def _require(data: Mapping, key: str, where: str) -> Any:
    if key not in data:
        raise ValueError(f'{where} lacks key {key!r}; has {sorted(data)}')
    return data[key]


__all__ = [
    'NvmlProcessTableReader', 'ProcessTableReader', 'RecordedProcessTableReader',
    'physical_device_index'
]
