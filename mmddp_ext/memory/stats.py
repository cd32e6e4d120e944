"""One memory sample of this process: its GPU's counters, device totals, host RSS.

:class:`MemoryReader` reads, :class:`MemorySample` is what it returns. The reader never resets
torch's peak counters: MMEngine's ``LogProcessor`` resets them (through
``get_max_cuda_memory``) every time it logs its ``memory`` field, so our peak is the running
maximum of the GPU's peak (:meth:`mmddp_ext.gpu.Gpus.peak`) read every iteration *before*
MMEngine's logger runs — both numbers stay right.

On a CPU there is no device: allocated/reserved/device numbers are None and the host RSS (and
its peak) is what is measured, labelled as such.
"""
import os
import resource
import socket
import time
from dataclasses import asdict, dataclass
from typing import Any, Dict, Optional

from ..gpu import gpus
from ..utils.memory_reads import rss_bytes
from ..utils.units import MIB


@dataclass(frozen=True)
class MemorySample:
    """Memory of one rank at one iteration (bytes; None where it does not apply).

    Attributes:
        rank: global rank.
        host: host name.
        pid: process id.
        device: 'cuda:N' (torch's index) or 'cpu'.
        iter: training iteration of the sample.
        allocated: ``torch.cuda.memory_allocated`` (tensors).
        reserved: ``torch.cuda.memory_reserved`` (the caching allocator's pool).
        peak_allocated: running maximum of ``torch.cuda.max_memory_allocated``.
        device_used: used memory of the whole device, all processes (``mem_get_info``).
        device_total: total memory of the device.
        rss: resident set size of this process on the host.
        peak_rss: the peak resident set size of this process (``ru_maxrss``).
        time: Unix time of the sample.
    """

    rank: int
    host: str
    pid: int
    device: str
    iter: int
    allocated: Optional[int]
    reserved: Optional[int]
    peak_allocated: Optional[int]
    device_used: Optional[int]
    device_total: Optional[int]
    rss: int
    peak_rss: int
    time: float

    def to_dict(self) -> Dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)

    def mib(self, key: str) -> Optional[float]:
        """A field in MiB, rounded to 0.1 (None stays None)."""
        value = getattr(self, key)
        return None if value is None else round(value / MIB, 1)


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


class MemoryReader:
    """Reads :class:`MemorySample` s of this process for one device.

    Args:
        rank: global rank put into every sample.
        device: this rank's device (``torch.device`` or ``'cuda:N'``, see
            :func:`mmddp_ext.gpu.rank_device`); 'cpu' reads host memory only.
    """

    def __init__(self, rank: int, device: Any) -> None:
        self.rank = rank
        self.device = str(device)
        self.is_cuda = self.device.startswith('cuda')
        self.index = int(self.device.split(':')[1]) if self.is_cuda else None
        self.host = socket.gethostname()
        self._peak_allocated = 0

    def track_peak(self) -> None:
        """Fold torch's current peak into ours (cheap; call every iteration, before the
        logger hook, whose LogProcessor resets torch's counter)."""
        if self.is_cuda:
            self._peak_allocated = max(self._peak_allocated, gpus().peak(self.index))

    def read(self, iteration: int) -> MemorySample:
        """A sample now; resets nothing."""
        alloc = reserved = peak = used = total = None
        if self.is_cuda:
            g = gpus()
            alloc, reserved = g.allocated(self.index), g.reserved(self.index)
            self.track_peak()  # after the reads: what was allocated then is part of the peak
            self._peak_allocated = peak = max(self._peak_allocated, alloc)
            free, total = g.mem_get_info(self.index)
            used = total - free
        rss = rss_bytes()  # ru_maxrss can lag the current RSS by a few pages: take the max
        return MemorySample(rank=self.rank, host=self.host, pid=os.getpid(), device=self.device,
                            iter=iteration, allocated=alloc, reserved=reserved, peak_allocated=peak,
                            device_used=used, device_total=total, rss=rss,
                            peak_rss=max(_peak_rss(), rss), time=time.time())
