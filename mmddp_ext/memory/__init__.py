"""Memory: what each rank holds and why, read and forecast.

Readers (:mod:`.stats`: host and device memory per rank; :mod:`.nvml`: NVML's process tables,
``pynvml`` imported only when a live reader is used), the pure comparisons and rules
(:mod:`.stray`: memory held by the wrong process; :mod:`.forecast`: the fit behind ``--explain
--memory``) and
:mod:`.budget` (``scaling.memory_budget_mib``). docs/memory.md shows them at work.
"""
from .nvml import (NvmlProcessTableReader, ProcessTableReader, RecordedProcessTableReader,
                   physical_device_index)
from .stray import CAUSES, DeviceTable, Finding, GpuProcess, RankIdentity, find_stray, format_bytes

__all__ = [
    'CAUSES', 'DeviceTable', 'Finding', 'GpuProcess', 'NvmlProcessTableReader',
    'ProcessTableReader', 'RankIdentity', 'RecordedProcessTableReader', 'find_stray',
    'format_bytes', 'physical_device_index'
]
