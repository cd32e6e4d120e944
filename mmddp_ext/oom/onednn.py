"""oneDNN after an out-of-memory error: what freeing memory does not repair.

After oneDNN (torch's CPU convolutions) failed to create a primitive for want of memory, the
thread stays unable to create one, even with the memory back and the limit lifted; its kernels
can also segfault after a failed allocation (docs/memory.md, 'When a rank runs out of memory').
Under ``scaling.memory_budget_mib`` oneDNN is off from the start (``apply_budget``); under a
limit of the user's own (``ulimit -v``) :func:`turn_off_onednn_after` turns it off after its
first such failure. GPUs are not concerned (cuDNN).
"""
import logging
from typing import Optional

import torch

from ..utils.log import log_line
from .classify import exception_chain

PRIMITIVE_FAILURE = 'could not create a primitive'


def turn_off_onednn_after(exc: Optional[BaseException]) -> bool:
    """After an out-of-memory error ``exc``: if oneDNN failed to create a primitive, turn oneDNN
    off for the rest of this process (torch's own CPU kernels from now on) and say so once.

    Args:
        exc: The out-of-memory error a step or a trial raised (None: nothing failed).

    Returns:
        Whether oneDNN was turned off now (False: it was not the cause, or it is off already).
    """

    failed_in_onednn = any(PRIMITIVE_FAILURE in str(e) for e in exception_chain(exc))
    if not failed_in_onednn or not torch.backends.mkldnn.enabled:
        return False
    torch.backends.mkldnn.enabled = False
    log_line(
        'oneDNN could not create a primitive when memory ran out, and it stays unable to on '
        'this thread once that happened (freeing memory does not repair it): convolutions go on '
        "with torch's own CPU kernels for the rest of this process (slower; docs/memory.md)",
        logging.WARNING)
    return True
