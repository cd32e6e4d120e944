"""Checkpoints: MMEngine's local loader replaced by one that keeps ``weights_only=True`` on
torch >= 2.6 and allows exactly MMEngine's own types (:mod:`.loader`), the plain form that
plain ``torch.load(path)`` opens (:mod:`.plain`), and what a save refuses or reports
(:mod:`.save`). docs/checkpoints.md says why.
"""
from .loader import (UNSAFE_ENV, load_checkpoint_file, load_from_local_safe, register_safe_loader,
                     safe_globals)
from .plain import PLAIN_KEY, STORED_DATASET_META, from_plain, to_plain
from .save import (DISK_FULL, REFUSED, disk_full_error, nonfinite_tensors, previous_checkpoint,
                   refuse_nonfinite, refused_save_error, save_error)

__all__ = [
    'UNSAFE_ENV', 'load_checkpoint_file', 'load_from_local_safe', 'register_safe_loader',
    'safe_globals', 'PLAIN_KEY', 'STORED_DATASET_META', 'from_plain', 'to_plain', 'DISK_FULL',
    'disk_full_error', 'nonfinite_tensors', 'previous_checkpoint', 'refuse_nonfinite', 'REFUSED',
    'refused_save_error', 'save_error'
]
