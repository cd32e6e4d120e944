"""Giving back what a failed attempt left."""
import gc
import weakref

import torch

from mmddp_ext.oom.release import release_memory


def test_release_memory_collects_what_a_failed_attempt_left_in_cycles():

    class Frame:  # a traceback's frames reference each other: a cycle holding a tensor
        pass

    a, b = Frame(), Frame()
    a.other, b.other, a.tensor = b, a, torch.zeros(1024)
    alive = weakref.ref(a)
    gc.disable()  # only release_memory may collect here
    try:
        del a, b
        assert alive() is not None
        release_memory()
        assert alive() is None
    finally:
        gc.enable()
