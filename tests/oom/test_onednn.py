"""oneDNN (torch's CPU convolutions) does not survive a failed allocation: its kernels can crash
(a segfault), or the thread stays unable to create a primitive. Under a budget the product uses
torch's own kernels: every out-of-memory error is then torch's allocator error and the next
step trains (``tests/helpers/onednn_oom.py``, in a process of its own; the measured failures
with oneDNN on: docs/memory.md, 'When a rank runs out of memory'). Under a limit of the
user's own, oneDNN is turned off after its first failure (:mod:`mmddp_ext.oom.onednn`)."""
import json

import pytest
import torch

from mmddp_ext.oom.onednn import turn_off_onednn_after

from conftest import PYTHON, check_ok, run

HELPER = 'tests/helpers/onednn_oom.py'
LIMITS = 12  # evenly spaced over the whole range: forward, backward and optimizer each fail


def _report(mode, data):
    out = check_ok(run([PYTHON, HELPER, mode, data, 'budget', str(LIMITS)]))  # a crash fails here
    return json.loads(out.split('report ', 1)[1].splitlines()[0])


@pytest.mark.slow
@pytest.mark.parametrize('mode', ['trials', 'guard'])
def test_under_a_budget_every_failure_is_torchs_and_the_next_step_trains(mode, demo_data):
    """The finder's trial and the guard's step at 32 samples under limits from above the
    step's need down to 1 MiB, :data:`LIMITS` of them evenly spaced (many failure points:
    forward, backward, optimizer):
    the process never crashes, every failure is torch's allocator error (never oneDNN's), and
    with the limit lifted a step at 4 samples trains."""
    r = _report(mode, demo_data)
    assert r['onednn_on'] is False and not r['onednn_failed'], r
    assert int(r['tried'].split('..')[1]) <= r['stride'], r  # the whole sweep ran, down to 1 step
    assert r['errors'], r  # the limits did bind
    assert all(
        'DefaultCPUAllocator' in e or 'out of memory on rank' in e or "can't allocate memory" in e
        for e in r['errors']), r
    assert r['next_trains'] is True, r


def test_a_primitive_failure_turns_onednn_off_once():
    """oneDNN's own error, in the chain of what a step raised, turns it off (once); another
    out-of-memory error leaves it as it is."""
    enabled = torch.backends.mkldnn.enabled
    try:
        torch.backends.mkldnn.enabled = True
        assert turn_off_onednn_after(RuntimeError("DefaultCPUAllocator: can't allocate")) is False
        assert torch.backends.mkldnn.enabled
        try:
            try:
                raise RuntimeError('could not create a primitive')
            except RuntimeError as inner:
                raise torch.OutOfMemoryError('out of memory on rank(s) [1]') from inner
        except torch.OutOfMemoryError as e:
            assert turn_off_onednn_after(e) is True
            assert torch.backends.mkldnn.enabled is False
            assert turn_off_onednn_after(e) is False  # said once
    finally:
        torch.backends.mkldnn.enabled = enabled
