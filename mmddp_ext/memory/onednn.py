"""oneDNN after an out-of-memory error: what freeing memory does not repair.

When oneDNN (torch's CPU convolutions) fails to create a primitive because memory ran out
(``RuntimeError: could not create a primitive`` under an address-space limit), the thread that
asked stays unable to create one: every later convolution on it raises the same error, at any
size, with the memory back and even with the limit lifted; a new thread, or torch's own
kernels (``torch.backends.mkldnn.enabled = False``), convolve again (measured on torch 2.14.1:
docs/memory.md, 'What a failed step leaves behind'). A training step redone in smaller
micro-batches, or the finder's next trial, would then fail at every size; and a kernel may
crash instead (a segfault in a brgemm convolution after a failed allocation). So under
``scaling.memory_budget_mib`` oneDNN is off from the start
(:func:`mmddp_ext.memory.budget.apply_budget`), and under a limit of the user's own
(``ulimit -v``) it is turned off after its first such failure: the process goes on with torch's
own kernels (slower: 1.5-2.9x for a ResNet-18 step on a CPU), said once. GPUs are not
concerned (their convolutions are cuDNN's).
"""
import logging
from typing import Optional

from ..utils.log import log_line

PRIMITIVE_FAILURE = 'could not create a primitive'


def _failed_in_onednn(exc: Optional[BaseException]) -> bool:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if PRIMITIVE_FAILURE in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def turn_off_onednn_after(exc: Optional[BaseException]) -> bool:
    """After an out-of-memory error ``exc``: if oneDNN failed to create a primitive, turn oneDNN
    off for the rest of this process (torch's own CPU kernels from now on) and say so once.

    Args:
        exc: The out-of-memory error a step or a trial raised (None: nothing failed).

    Returns:
        Whether oneDNN was turned off now (False: it was not the cause, or it is off already).
    """
    import torch

    if not _failed_in_onednn(exc) or not torch.backends.mkldnn.enabled:
        return False
    torch.backends.mkldnn.enabled = False
    log_line(
        'oneDNN could not create a primitive when memory ran out, and it stays unable to on '
        'this thread once that happened (freeing memory does not repair it): convolutions go on '
        "with torch's own CPU kernels for the rest of this process (slower; docs/memory.md)",
        logging.WARNING)
    return True
