"""Giving back what a failed attempt left (:func:`release_memory`), and this process's memory
for a debug line around the failure (:func:`memory_reading`)."""
import gc
from typing import Any

import torch

from ..gpu import gpus
from ..utils.memory_reads import address_space_bytes, rss_bytes
from ..utils.units import format_mib


def drop_stale_backward_work(device: Any = None) -> None:
    """Let autograd drop what a failed backward left queued, on this thread and on the
    device's autograd thread.

    When a backward raises (an out-of-memory error in a kernel) while another node of the same graph
    is ready (a residual block's shortcut beside its main branch), the engine leaves that node's
    task in the thread's ready queue: its incoming gradient and, through the node, the rest of the
    graph with its saved activations (docs/memory.md). ``gc.collect()`` cannot reach it; the engine
    drops such tasks, their graph being gone, when the queue is next used. A one-element backward on
    the calling thread (a CPU graph's queue) and, for a CUDA ``device``, one on that device (its own
    autograd thread and queue) is that next use.

    Args:
        device: The device the failed step ran on (a ``torch.device`` or None for the CPU).
    """
    with torch.inference_mode(False), torch.enable_grad():
        torch.zeros((), requires_grad=True).mul(1.0).backward()
        if device is not None and torch.device(device).type == 'cuda':
            torch.zeros((), device=device, requires_grad=True).mul(1.0).backward()


def release_memory(device: Any = None) -> None:
    """Give back what a failed attempt left: the autograd work a failed backward left queued
    (:func:`drop_stale_backward_work`), reference cycles through its traceback's frames and,
    where this process has a GPU context, the caching allocator's free blocks.

    Args:
        device: The device the attempt ran on (None: the CPU).
    """
    drop_stale_backward_work(device)
    gc.collect()
    gpus().empty_cache()


def memory_reading(device: Any = None) -> str:
    """This process's memory now, for a debug line around an out-of-memory error: on a CPU
    its address space (``VmSize``, what a budget limits) and resident set; on a GPU torch's
    allocated and reserved bytes on ``device``."""
    host = f'VmSize {format_mib(address_space_bytes())}, RSS {format_mib(rss_bytes())}'
    if device is None or torch.device(device).type != 'cuda':
        return host
    index = torch.device(device).index
    index = gpus().current() if index is None else index
    return (f'cuda:{index} allocated {format_mib(gpus().allocated(index))}, reserved '
            f'{format_mib(gpus().reserved(index))}; {host}')
