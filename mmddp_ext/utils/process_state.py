"""Process-wide settings belong to whoever owns the process.

Our command-line entries own theirs (``tools/dist_train.py``, the workers ``launch()`` starts,
the torchrun front, ``python -m mmddp_ext.diagnose``): they call :func:`own_process` first, and
what a run sets for the whole process stays (the collector frozen after start-up, thread
counts, the CPU memory budget's address-space limit, warning filters, environment variables).
Anywhere else our package is a guest (MMPose's ``tools/train.py``, a notebook, a user's script
calling ``mmddp_ext.entry.train.main([...])`` or ``DDPRunner.from_cfg(cfg).train()``): the
library call takes a :func:`snapshot` before it changes anything and :func:`restore` puts it back
when it ends.

What is kept and restored: the collector on or off (a guest call never freezes), the
environment, ``RLIMIT_AS``, the warning filters, torch's intra-op thread count and whether
oneDNN is on. glibc's allocator options (``mallopt``, set by a CPU memory budget only) cannot be
read back, so they stay.
"""
import gc
import os
import resource
import warnings
from typing import Any, Dict, Optional

import torch

_OWNED = False


def own_process() -> None:
    """Declare this process ours (a command-line entry, before it trains)."""
    global _OWNED
    _OWNED = True


def owns_process() -> bool:
    """Whether one of our command-line entries owns this process."""
    return _OWNED


def snapshot() -> Optional[Dict[str, Any]]:
    """What :func:`restore` puts back; None where we own the process (nothing to put back)."""
    if _OWNED:
        return None
    filters = warnings.catch_warnings()  # public save and restore of the warning filters
    filters.__enter__()
    return dict(gc=gc.isenabled(), environ=dict(os.environ),
                rlimit_as=resource.getrlimit(resource.RLIMIT_AS), filters=filters,
                threads=torch.get_num_threads(), mkldnn=torch.backends.mkldnn.enabled)


def restore(state: Optional[Dict[str, Any]]) -> None:
    """Put back what :func:`snapshot` read (once; nothing for None)."""
    if state is None or state.get('restored'):
        return
    state['restored'] = True
    state['filters'].__exit__(None, None, None)
    for name in set(os.environ) - set(state['environ']):
        del os.environ[name]
    os.environ.update(state['environ'])
    soft, hard = state['rlimit_as']
    if resource.getrlimit(resource.RLIMIT_AS) != (soft, hard):
        resource.setrlimit(resource.RLIMIT_AS, (soft, resource.getrlimit(resource.RLIMIT_AS)[1]))
    if torch.get_num_threads() != state['threads']:
        torch.set_num_threads(state['threads'])
    torch.backends.mkldnn.enabled = state['mkldnn']
    (gc.enable if state['gc'] else gc.disable)()
