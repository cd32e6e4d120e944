"""Read NVML's per-process table of a device, live or from a recording.

:class:`NvmlProcessTableReader` asks the driver through ``pynvml`` (the ``nvidia-ml-py``
package), which is imported only when a reader is used, so importing this module never needs
a GPU or a driver. :class:`RecordedProcessTableReader` replays tables recorded as JSON, for
tests and for analysing a run after the fact.

NVML numbers devices physically (as ``nvidia-smi`` does), while torch numbers the devices left
visible by ``CUDA_VISIBLE_DEVICES``; :func:`physical_device_index` maps one to the other.
"""
import socket
from typing import Any, Dict, Mapping, Optional, Protocol, runtime_checkable

from .stray import DeviceTable, GpuProcess

# pynvml reports "not available" as the all-ones 64-bit value in older versions.
_NOT_AVAILABLE = 2**64 - 1


@runtime_checkable
class ProcessTableReader(Protocol):
    """Anything that returns the process table of a device by its physical index."""

    def read(self, device_index: int) -> DeviceTable:
        """The process table of the device with physical (NVML) index ``device_index``."""
        ...


class NvmlProcessTableReader:
    """Reads process tables from the NVIDIA driver through ``pynvml``.

    NVML is initialised on the first :meth:`read` and shut down by :meth:`close` (or on
    leaving a ``with`` block).

    Attributes:
        host: Host name put into every table read.
    """

    def __init__(self, host: Optional[str] = None) -> None:
        self.host: str = host if host is not None else socket.gethostname()
        self._nvml: Any = None

    def __enter__(self) -> 'NvmlProcessTableReader':
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    @staticmethod
    def available() -> bool:
        """True when ``pynvml`` imports and ``nvmlInit`` succeeds; never raises."""
        try:
            import pynvml
            pynvml.nvmlInit()
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - any failure means "not available"
            return False
        return True

    def read(self, device_index: int) -> DeviceTable:
        """The process table of the device with physical (NVML) index ``device_index``.

        Raises:
            RuntimeError: If ``pynvml`` cannot be imported or NVML fails for this device.
        """
        nvml = self._lib()
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(device_index)
            total = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
            rows = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except nvml.NVMLError as exc:
            raise RuntimeError(f'NVML could not read GPU {device_index} of host {self.host}: '
                               f'{exc}') from exc
        processes = tuple(GpuProcess(int(row.pid), _used_bytes(row)) for row in rows)
        return DeviceTable(self.host, device_index, total, processes)

    def close(self) -> None:
        """Shut NVML down if this reader initialised it; reading again re-initialises it."""
        if self._nvml is not None:
            nvml, self._nvml = self._nvml, None
            try:
                nvml.nvmlShutdown()
            except nvml.NVMLError:
                pass

    def _lib(self) -> Any:
        if self._nvml is None:
            try:
                import pynvml
            except ImportError as exc:
                raise RuntimeError('pynvml (package nvidia-ml-py) is not installed') from exc
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as exc:
                raise RuntimeError(f'nvmlInit failed on host {self.host}: {exc}') from exc
            self._nvml = pynvml
        return self._nvml


def _used_bytes(row: Any) -> Optional[int]:
    used = getattr(row, 'usedGpuMemory', None)
    if used is None or int(used) >= _NOT_AVAILABLE:
        return None
    return int(used)


def physical_device_index(local_index: int, cuda_visible_devices: Optional[str]) -> int:
    """Map torch's device index to the physical (NVML) index.

    Args:
        local_index: Index as torch sees it (``torch.cuda.current_device()``).
        cuda_visible_devices: The value of ``CUDA_VISIBLE_DEVICES``, or None when unset.

    Returns:
        The physical index: ``'2,3'`` maps local 1 to 3; None or ``''`` keeps the index.

    Raises:
        ValueError: If ``local_index`` is negative or not in the list, or an entry of the list
            is not a plain integer (UUIDs such as ``GPU-...`` cannot be mapped without NVML).
    """
    if isinstance(local_index, bool) or not isinstance(local_index, int) or local_index < 0:
        raise ValueError(f'local device index must be a non-negative integer, '
                         f'got {local_index!r}')
    if cuda_visible_devices is None or not cuda_visible_devices.strip():
        return local_index
    entries = [_visible_entry(e, cuda_visible_devices) for e in cuda_visible_devices.split(',')]
    if local_index >= len(entries):
        raise ValueError(f'local device index {local_index} is out of range for '
                         f'CUDA_VISIBLE_DEVICES={cuda_visible_devices!r} '
                         f'({len(entries)} device(s))')
    return entries[local_index]


def _visible_entry(entry: str, whole: str) -> int:
    text = entry.strip()
    if text.isdigit():
        return int(text)
    if text.upper().startswith(('GPU-', 'MIG-')):
        raise ValueError(f'CUDA_VISIBLE_DEVICES={whole!r} names device {text!r} by UUID; '
                         f'only integer indices can be mapped to NVML indices')
    raise ValueError(f'CUDA_VISIBLE_DEVICES={whole!r} has entry {text!r}, which is not a '
                     f'non-negative integer')


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
