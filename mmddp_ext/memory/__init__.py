"""Find GPU memory held by the wrong process (stray CUDA contexts, foreign jobs).

:mod:`.stray` is pure and compares the ranks' identities with NVML's process tables;
:mod:`.nvml` reads those tables (``pynvml`` is imported only when a live reader is used).
"""
from .nvml import (NvmlProcessTableReader, ProcessTableReader, RecordedProcessTableReader,
                   physical_device_index)
from .stray import CAUSES, DeviceTable, Finding, GpuProcess, RankIdentity, find_stray, format_bytes

__all__ = [
    'CAUSES', 'DeviceTable', 'Finding', 'GpuProcess', 'NvmlProcessTableReader',
    'ProcessTableReader', 'RankIdentity', 'RecordedProcessTableReader', 'find_stray',
    'format_bytes', 'physical_device_index'
]
