"""A resettable peak of this process's memory, for measuring one step at a time: torch's peak
counters on a GPU, the kernel's peak RSS (``VmHWM``, reset through ``/proc/self/clear_refs``)
on a CPU. The batch finder's trials and the memory forecast measure with it.
"""
from typing import Optional

import torch

from ..gpu import gpus


def _status_kib(key: str) -> Optional[int]:
    """A ``/proc/self/status`` field in KiB (None where there is no such file)."""
    try:
        with open('/proc/self/status') as f:
            for line in f:
                if line.startswith(key + ':'):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def reset_peak(device: torch.device) -> bool:
    """Start a new peak measurement: torch's peak counters on a GPU; on a CPU the kernel's
    peak RSS of this process (``/proc/self/clear_refs``, Linux >= 4.0). False where the peak
    cannot be reset."""
    if device.type == 'cuda':
        gpus().reset_peak(device.index)
        return True
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
        return _status_kib('VmHWM') is not None
    except OSError:
        return False


def read_peak(device: torch.device) -> Optional[int]:
    """The peak since :func:`reset_peak`, in bytes (torch's peak allocated bytes on a GPU; the
    peak RSS of this process on a CPU)."""
    if device.type == 'cuda':
        return gpus().peak(device.index)
    kib = _status_kib('VmHWM')
    return None if kib is None else kib * 1024
