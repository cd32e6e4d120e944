"""Test-only: this process's memory counters as the kernel keeps them (``/proc/self/status``),
read without psutil or mmddp_ext's own readers, so that a test can hold what mmddp_ext reports
against them."""
from typing import Dict


def proc_status(*fields: str) -> Dict[str, int]:
    """``{field: bytes}`` of ``fields`` (``VmRSS``, ``VmHWM``, ``VmSize``, ``VmPeak``, ...),
    all from one read of ``/proc/self/status``."""
    out = {}
    with open('/proc/self/status') as f:
        for line in f:
            key = line.split(':', 1)[0]
            if key in fields:
                out[key] = int(line.split()[1]) * 1024
    missing = [f for f in fields if f not in out]
    if missing:
        raise RuntimeError(f'no {", ".join(missing)} in /proc/self/status')
    return out
