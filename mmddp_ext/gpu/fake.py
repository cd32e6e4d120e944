"""A host of N simulated GPUs behind :class:`~mmddp_ext.gpu.Gpus`, for the test suite.

The fake's processes compute on the CPU (gloo) while the package reads "GPU" memory from the
fake, so every CUDA and NVML branch runs on a machine without a GPU. :func:`make_fake_host`
describes a host (its defaults are the field's numbers, ``FIELD_*``); :class:`FakeGpus` is one
process's view of it and says how it follows CUDA. What it simulates and what it cannot tell:
docs/memory.md, 'GPU numbers: measured on a GPU, or from the fake'.
"""
import json
import os
import os.path as osp
import socket
from typing import Dict, List, Optional, Sequence, Tuple

import psutil
import torch

from ..utils.memory_reads import rss_bytes
from . import FAKE_ENV, ProcessRow, physical

GIB, MIB = 2**30, 2**20
FIELD_TOTAL = round(23.64 * GIB)  # the user's card
FIELD_CONTEXT = 300 * MIB  # CUDA context with lazy loading (pytorch PR #86509)
FIELD_FOREIGN = round(1.89 * GIB)  # the process the user's OOM text showed on GPU 0
POOL_GRANULE = 2 * MIB  # the caching allocator rounds its segments up to 2 MiB


def make_fake_host(folder: str, count: int = 2, total_bytes: int = FIELD_TOTAL,
                   context_bytes: int = FIELD_CONTEXT, name: Optional[str] = None,
                   foreign: Sequence[Tuple[int, int,
                                           int]] = (), nvml: bool = True) -> Dict[str, str]:
    """Describe a fake host in ``folder`` and return the environment that selects it.

    Args:
        folder: Shared by every process of the host (their NVML rows live there).
        count: GPUs on the host.
        total_bytes: Memory of each GPU.
        context_bytes: What a process's context takes on each GPU it touches.
        name: Product name (default names the size).
        foreign: ``(physical index, pid, bytes)`` of processes outside the job.
        nvml: Whether NVML's tables can be read.

    Example::

        env = make_fake_host(str(tmp_path), count=2, foreign=[(0, 4242, FIELD_FOREIGN)])
        subprocess.run([...torchrun...], env={**os.environ, **env})
    """
    os.makedirs(folder, exist_ok=True)
    spec = dict(count=count, total_bytes=total_bytes, context_bytes=context_bytes, name=name
                or f'Fake GPU {total_bytes / GIB:.2f} GiB', nvml=nvml,
                foreign=[list(f) for f in foreign])
    with open(osp.join(folder, 'host.json'), 'w') as f:
        json.dump(spec, f)
    return {FAKE_ENV: folder}


class FakeGpus:
    """This process's view of the fake host described in ``folder``.

    It answers as ``torch.cuda`` and NVML would, following CUDA's behaviour:

    * a context of ``context_bytes`` on each device the process touches (CUDA with lazy module
      loading, pytorch PR #86509); touching a device means ``set_device`` or ``mem_get_info``
      on it, and before ``set_device`` the current device is 0, so a rank that asks before its
      pin leaves a context on GPU 0, as on a real host;
    * allocations that grow with what the caller allocates: on the current device, the growth
      of this process's resident memory since its context was created, plus what :meth:`hold`
      put on any device; peaks that reset (the kernel's peak RSS, ``/proc/self/clear_refs``);
      a caching pool (what was allocated when read, in 2 MiB segments) that only
      :meth:`empty_cache` shrinks;
    * NVML's table per physical device: every live process of the host folder (its context plus
      its pool) and the host's foreign processes; ``CUDA_VISIBLE_DEVICES`` remaps torch's
      indices to physical ones.

    * a GPU rank's decisions: :meth:`available` is True, so every branch on "this rank has a
      GPU" takes the GPU side; where that would hand torch a GPU-only thing (nccl, DDP's
      ``device_ids``, SyncBN) the caller uses the CPU's equivalent and says so through
      :meth:`replaced` (kept in ``replacements``).

    What it does not do: make an allocation fail at :meth:`set_memory_fraction` (it records the
    cap in ``fractions``).
    """

    def __init__(self, folder: str) -> None:
        try:
            with open(osp.join(folder, 'host.json')) as f:
                self.spec = json.load(f)
        except (OSError, ValueError) as exc:
            raise RuntimeError(f'{FAKE_ENV}={folder!r} names no fake GPU host '
                               f'(host.json: {exc})') from exc
        self.folder = folder
        self._current = 0
        self._contexts: List[int] = []  # physical indices, in the order touched
        self._base_rss: Optional[int] = None
        self._held: Dict[int, int] = {}
        self._held_peak: Dict[int, int] = {}
        self._pool: Dict[int, int] = {}
        self.fractions: Dict[int, float] = {}
        self.replacements: List[str] = []  # what replaced a GPU rank's decisions, in order

    # what torch.cuda answers
    def available(self) -> bool:
        return self.count() > 0

    def tensors_on_gpu(self) -> bool:
        return False

    def replaced(self, what: str, decided: object, used: object) -> str:
        line = (f'fake GPU host: {what} {decided} as on a GPU; {used} used (its tensors stay '
                'on the CPU)')
        self.replacements.append(line)
        return line

    def count(self) -> int:
        visible = os.environ.get('CUDA_VISIBLE_DEVICES')
        if visible is not None:  # as CUDA counts it: set but empty hides every GPU
            return len([entry for entry in visible.split(',') if entry.strip()])
        return int(self.spec['count'])

    def current(self) -> int:
        return self._current

    def set_device(self, index: int) -> None:
        self._check(index)
        self._current = index
        self._touch(index)

    def initialized(self) -> bool:
        return bool(self._contexts)

    def name(self, index: int) -> str:
        self._check(index)
        return str(self.spec['name'])

    def mem_get_info(self, index: int) -> Tuple[int, int]:
        self._touch(index)
        total = int(self.spec['total_bytes'])
        _, rows = self.process_table(physical(index))
        return max(0, total - sum(used or 0 for _, used in rows)), total

    def allocated(self, index: int) -> int:
        p = physical(index)
        return self._held.get(p, 0) + (self._grown() if self._is_current(p) else 0)

    def reserved(self, index: int) -> int:
        p = physical(index)
        pool = max(self._pool.get(p, 0), self.allocated(index))
        self._pool[p] = -(-pool // POOL_GRANULE) * POOL_GRANULE
        return self._pool[p]

    def peak(self, index: int) -> int:
        p = physical(index)
        held = self._held_peak.get(p, self._held.get(p, 0))
        if not self._is_current(p):
            return held
        hwm = _status_bytes('VmHWM')
        grown = max(self._grown(), hwm - self._base_rss) if hwm is not None else self._grown()
        return held + max(0, grown)

    def reset_peak(self, index: int) -> None:
        p = physical(index)
        self._held_peak[p] = self._held.get(p, 0)
        try:
            with open('/proc/self/clear_refs', 'w') as f:
                f.write('5')
        except OSError:
            pass

    def set_memory_fraction(self, fraction: float, index: int) -> None:
        if not 0 < fraction <= 1:
            raise ValueError(f'memory fraction must be in (0, 1], got {fraction!r}')
        self.fractions[physical(index)] = fraction

    def empty_cache(self) -> None:
        for p in self._contexts:
            self._pool[p] = 0
        self._publish()

    def tensor_device(self, index: int) -> torch.device:
        return torch.device('cpu')

    # what NVML answers
    def nvml_available(self) -> bool:
        return bool(self.spec.get('nvml', True))

    def process_table(self, physical_index: int) -> Tuple[int, Sequence[ProcessRow]]:
        if not self.nvml_available():
            raise RuntimeError('NVML is not available on this fake host')
        if not 0 <= physical_index < int(self.spec['count']):
            raise RuntimeError(f'NVML could not read GPU {physical_index}: Invalid Argument')
        self._publish()
        rows = [(int(pid), int(used)) for p, pid, used in self.spec['foreign']
                if p == physical_index]
        for pid, used in _rows(self.folder).items():
            if physical_index in used and psutil.pid_exists(pid):
                rows.append((pid, used[physical_index]))
        return int(self.spec['total_bytes']), tuple(sorted(rows))

    # what the fake adds
    @property
    def touched(self) -> List[int]:
        """Physical devices this process has a context on, in the order it touched them."""
        return list(self._contexts)

    def hold(self, index: int, nbytes: int) -> None:
        """Keep ``nbytes`` of "tensors" on device ``index`` (e.g. a checkpoint loaded there
        without ``map_location``); creates the device's context as a real allocation does.
        Unlike the growth of the process, which depends on what the host's allocator reuses,
        these bytes are exact."""
        self._touch(index)
        p = physical(index)
        self._held[p] = max(0, self._held.get(p, 0) + nbytes)
        self._held_peak[p] = max(self._held_peak.get(p, 0), self._held[p])
        self._publish()

    def release(self, index: int, nbytes: int) -> None:
        """Drop ``nbytes`` of what :meth:`hold` kept on device ``index`` (the pool keeps them
        until :meth:`empty_cache`, the peak until :meth:`reset_peak`)."""
        self.hold(index, -nbytes)

    def _check(self, index: int) -> None:
        if not 0 <= index < self.count():
            raise RuntimeError(f'CUDA error: invalid device ordinal {index} '
                               f'({self.count()} device(s))')

    def _touch(self, index: int) -> None:
        self._check(index)
        p = physical(index)
        if p not in self._contexts:
            self._contexts.append(p)
            if self._is_current(p):
                self._base_rss = rss_bytes()
            self._publish()

    def _is_current(self, p: int) -> bool:
        return p in self._contexts and p == physical(self._current)

    def _grown(self) -> int:
        if self._base_rss is None:
            return 0
        return max(0, rss_bytes() - self._base_rss)

    def _publish(self) -> None:
        used = {}
        for p in self._contexts:
            pool = max(self._pool.get(p, 0), self._held.get(p, 0))
            if self._is_current(p):
                pool = max(pool, self._grown())
            used[p] = int(self.spec['context_bytes']) + pool
        path = osp.join(self.folder, f'proc-{os.getpid()}.json')
        with open(path + '.part', 'w') as f:
            json.dump(dict(host=socket.gethostname(), used=used), f)
        os.replace(path + '.part', path)


def _rows(folder: str) -> Dict[int, Dict[int, int]]:
    """pid -> {physical index: used bytes} of every process that published a row."""
    out = {}
    for name in os.listdir(folder):
        if name.startswith('proc-') and name.endswith('.json'):
            try:
                with open(osp.join(folder, name)) as f:
                    used = json.load(f)['used']
            except (OSError, ValueError, KeyError):
                continue  # being replaced: read it next time
            out[int(name[5:-5])] = {int(k): int(v) for k, v in used.items()}
    return out


def _status_bytes(key: str) -> Optional[int]:
    try:
        with open('/proc/self/status') as f:
            for line in f:
                if line.startswith(key + ':'):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


__all__ = ['FIELD_CONTEXT', 'FIELD_FOREIGN', 'FIELD_TOTAL', 'FakeGpus', 'make_fake_host']
