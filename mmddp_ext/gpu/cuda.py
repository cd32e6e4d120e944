"""The real GPUs: ``torch.cuda`` and NVML (``pynvml``, package ``nvidia-ml-py``). The only
module of the package that imports either; NVML is initialised per table read."""
from typing import Any, List, Optional, Sequence, Tuple

import torch

from . import ProcessRow

# pynvml reports "not available" as the all-ones 64-bit value in older versions.
_NOT_AVAILABLE = 2**64 - 1


class CudaGpus:
    """:class:`~mmddp_ext.gpu.Gpus` over ``torch.cuda`` and NVML."""

    def available(self) -> bool:
        return torch.cuda.is_available()

    def tensors_on_gpu(self) -> bool:
        return torch.cuda.is_available()

    def replaced(self, what: str, decided: object, used: object) -> str:
        raise RuntimeError(f'a real GPU rank carries out its decisions: {what} {decided} was '
                           f'not to be replaced by {used}')

    def count(self) -> int:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0

    def current(self) -> int:
        return torch.cuda.current_device()

    def set_device(self, index: int) -> None:
        torch.cuda.set_device(index)

    def initialized(self) -> bool:
        # never asks the driver: called where memory may be short (after an out-of-memory error)
        return torch.cuda.is_initialized()

    def name(self, index: int) -> str:
        return torch.cuda.get_device_name(index)

    def mem_get_info(self, index: int) -> Tuple[int, int]:
        free, total = torch.cuda.mem_get_info(index)
        return int(free), int(total)

    def allocated(self, index: int) -> int:
        return int(torch.cuda.memory_allocated(index))

    def reserved(self, index: int) -> int:
        return int(torch.cuda.memory_reserved(index))

    def peak(self, index: int) -> int:
        return int(torch.cuda.max_memory_allocated(index))

    def reset_peak(self, index: int) -> None:
        torch.cuda.reset_peak_memory_stats(index)

    def set_memory_fraction(self, fraction: float, index: int) -> None:
        torch.cuda.set_per_process_memory_fraction(fraction, index)

    def empty_cache(self) -> None:
        if self.initialized():
            torch.cuda.empty_cache()

    def tensor_device(self, index: int) -> torch.device:
        return torch.device('cuda', index)

    def nvml_available(self) -> bool:
        try:
            import pynvml  # here: optional (nvidia-ml-py), and absent on a CPU host
            pynvml.nvmlInit()
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - any failure means "not available"
            return False
        return True

    def process_table(self, physical: int) -> Tuple[int, Sequence[ProcessRow]]:
        nvml = _nvml()
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(physical)
            total = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
            rows: List[Any] = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except nvml.NVMLError as exc:
            raise RuntimeError(f'NVML could not read GPU {physical}: {exc}') from exc
        finally:
            try:
                nvml.nvmlShutdown()
            except nvml.NVMLError:
                pass
        return total, tuple((int(row.pid), _used_bytes(row)) for row in rows)


def _nvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:
        raise RuntimeError('pynvml (package nvidia-ml-py) is not installed') from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise RuntimeError(f'nvmlInit failed: {exc}') from exc
    return pynvml


def _used_bytes(row: Any) -> Optional[int]:
    used = getattr(row, 'usedGpuMemory', None)
    if used is None or int(used) >= _NOT_AVAILABLE:
        return None
    return int(used)


__all__ = ['CudaGpus']
