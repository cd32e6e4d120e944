"""What a library call must leave as it found it in the caller's process: the garbage
collector (on or off, frozen objects), the environment, the address-space limit, the warning
filters, torch's thread count, and glibc's allocator options where they can be read back
(they cannot: :data:`NOT_READABLE`)."""
import gc
import os
import resource
import warnings

import torch


def snapshot() -> dict:
    return dict(gc_enabled=gc.isenabled(), gc_frozen=gc.get_freeze_count(),
                environ=dict(os.environ), rlimit_as=resource.getrlimit(resource.RLIMIT_AS),
                warning_filters=list(warnings.filters), torch_threads=torch.get_num_threads(),
                mkldnn=torch.backends.mkldnn.enabled)


def changes(before: dict, after: dict) -> dict:
    """``{what: (before, after)}`` for each difference; the environment key by key."""
    out = {}
    for key in before:
        if key == 'environ':
            for name in set(before[key]) | set(after[key]):
                if before[key].get(name) != after[key].get(name):
                    out[f'environ[{name}]'] = (before[key].get(name), after[key].get(name))
        elif before[key] != after[key]:
            out[key] = ((len(before[key]), len(after[key])) if key == 'warning_filters' else
                        (before[key], after[key]))
    return out
