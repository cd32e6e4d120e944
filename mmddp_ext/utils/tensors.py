"""Checks over many tensors at once."""
from typing import List, Sequence

import torch


def nonfinite_indices(tensors: Sequence[torch.Tensor]) -> List[int]:
    """Indices of the tensors that hold a NaN or Inf: one device-to-host copy in all (the
    first tensor's device gathers the flags), no collective."""
    if not tensors:
        return []
    device = tensors[0].device
    flags = torch.stack([torch.isfinite(t).all().to(device) for t in tensors]).cpu()
    return [i for i, ok in enumerate(flags.tolist()) if not ok]
