"""This process's GPUs: the one seam between mmddp_ext and ``torch.cuda`` / NVML.

Every question the package asks about a GPU (which is this rank's, how much is allocated,
reserved and at peak on it, which processes hold memory on it) goes through :func:`gpus`, so
no other module imports ``torch.cuda`` or ``pynvml`` (``tests/gpu/test_seam.py`` keeps it so).
:class:`~mmddp_ext.gpu.cuda.CudaGpus` asks the real driver; :class:`~mmddp_ext.gpu.fake.FakeGpus`
simulates a host of N GPUs for the test suite, selected by ``MMDDP_FAKE_GPUS`` (a folder the
fake's processes share, written by :func:`~mmddp_ext.gpu.fake.make_fake_host`).
Which numbers come from a real GPU and which from the fake: ``docs/memory.md``.

Indices are torch's (after ``CUDA_VISIBLE_DEVICES``) except where a name says ``physical``
(NVML's and ``nvidia-smi``'s numbering); :func:`physical_device_index` maps one to the other.
"""
import os
from typing import Optional, Protocol, Sequence, Tuple

FAKE_ENV = 'MMDDP_FAKE_GPUS'

ProcessRow = Tuple[int, Optional[int]]  # (pid, used bytes, None where NVML does not say)


class Gpus(Protocol):
    """What the package asks about this process's GPUs (indices as torch numbers them)."""

    def available(self) -> bool:
        """Whether this process has a GPU."""

    def tensors_on_gpu(self) -> bool:
        """Whether tensors placed on this process's GPU live in GPU memory (False for the
        fake, whose ranks compute on the CPU and talk over gloo). Decisions are made from
        :meth:`available`; this only says where a GPU-only choice must be replaced
        (:meth:`replaced`)."""

    def replaced(self, what: str, decided: object, used: object) -> str:
        """Note that ``used`` replaces a GPU rank's ``decided`` for ``what``, and return the
        line for the log. Asked only where a rank has a GPU but its tensors stay on the CPU
        (the fake GPU host: its ranks decide as GPU ranks do, docs/memory.md)."""

    def count(self) -> int:
        """GPUs visible to this process (0 without one)."""

    def current(self) -> int:
        """The current device index."""

    def set_device(self, index: int) -> None:
        """Make ``index`` the current device (creates its context)."""

    def initialized(self) -> bool:
        """Whether this process has created a CUDA context yet."""

    def name(self, index: int) -> str:
        """The device's product name."""

    def mem_get_info(self, index: int) -> Tuple[int, int]:
        """``(free, total)`` bytes of the whole device, all processes (creates a context)."""

    def allocated(self, index: int) -> int:
        """Bytes of live tensors of this process on the device."""

    def reserved(self, index: int) -> int:
        """Bytes held by this process's caching allocator on the device."""

    def peak(self, index: int) -> int:
        """Peak allocated bytes since the last :meth:`reset_peak`."""

    def reset_peak(self, index: int) -> None:
        """Start a new peak measurement."""

    def set_memory_fraction(self, fraction: float, index: int) -> None:
        """Cap this process's share of the device."""

    def empty_cache(self) -> None:
        """Return the caching allocator's free blocks to the device."""

    def tensor_device(self, index: int):
        """The ``torch.device`` tensors of this GPU go to."""

    def nvml_available(self) -> bool:
        """Whether the per-process tables of NVML can be read; never raises."""

    def process_table(self, physical: int) -> Tuple[int, Sequence[ProcessRow]]:
        """``(total bytes, rows)`` of NVML's compute processes on a physical device.

        Raises:
            RuntimeError: NVML is missing or failed for this device.
        """


_active: Optional[Gpus] = None


def gpus() -> Gpus:
    """The GPUs of this process: the fake when ``MMDDP_FAKE_GPUS`` names its folder, else the
    real ones (chosen at the first call; torch and NVML are imported by then only)."""
    global _active
    if _active is None:
        folder = os.environ.get(FAKE_ENV)
        if folder:  # here: the two import this module's names, and only one is used
            from .fake import FakeGpus
            _active = FakeGpus(folder)
        else:
            from .cuda import CudaGpus
            _active = CudaGpus()
    return _active


def use_gpus(backend: Optional[Gpus]) -> Optional[Gpus]:
    """Make ``backend`` this process's GPUs (None: choose again at the next :func:`gpus`);
    returns the one before, for tests that put it back."""
    global _active
    previous, _active = _active, backend
    return previous


def physical_device_index(local_index: int, cuda_visible_devices: Optional[str]) -> int:
    """Map torch's device index to the physical (NVML) index.

    Args:
        local_index: Index as torch sees it (``current()``).
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


def rank_device():
    """This rank's device for memory: ``cuda:N`` (its current GPU, real or fake), else
    ``cpu``."""
    import torch  # here: the memory readers import this seam and must not load torch
    g = gpus()
    return torch.device('cuda', g.current()) if g.available() else torch.device('cpu')


def tensor_device(device):
    """Where tensors meant for ``device`` (a ``torch.device``) go: the fake's GPUs keep them
    on the CPU."""
    return gpus().tensor_device(device.index) if device.type == 'cuda' else device


def physical(index: int) -> int:
    """The physical index of torch's device ``index`` in this process."""
    return physical_device_index(index, os.environ.get('CUDA_VISIBLE_DEVICES'))


__all__ = [
    'FAKE_ENV', 'Gpus', 'gpus', 'physical', 'physical_device_index', 'rank_device', 'tensor_device',
    'use_gpus'
]
