"""After a real out-of-memory error in a backward that has a queued sibling (a residual
block's shortcut beside its main branch), the rank gets its memory back: the finder's trial
and the training-time guard, each in a process of its own on the demo pose model
(``tests/helpers/oom_sibling.py``; the mechanism: docs/memory.md, 'When a rank runs out
of memory')."""
import json

import pytest

from conftest import PYTHON, check_ok, run

HELPER = 'tests/helpers/oom_sibling.py'
# layer2's first block: its downsample shortcut's backward runs first, its main branch waits
SHORTCUT = 'backbone.layer2.0.downsample'


def _report(mode, module, data):
    out = check_ok(run([PYTHON, HELPER, mode, module, data]))
    return json.loads(out.split('report ', 1)[1].splitlines()[0])


@pytest.mark.slow
def test_a_trial_that_fails_beside_a_queued_shortcut_gives_its_memory_back(demo_data):
    """The trial at 64 samples fails in its backward (its forward went through the whole
    model) at the shortcut; after the trial the address space is back to where it started,
    within a tenth of what the step had taken when it failed, and a trial at 32 samples fits
    under the same limit. Before the fix 87 MiB stayed queued in autograd and 32 did not
    fit."""
    r = _report('trials', SHORTCUT, demo_data)
    assert r['cap'] is not None and r['forward_done'] and r['fits'] is False, r
    assert r['optimizer_steps'] == 0, r  # raised in the backward, not in the optimizer
    taken = r['cap'] - r['before']
    assert taken > 0
    assert r['after'] - r['before'] <= taken / 10, r
    assert r['half_fits'] is True, r


@pytest.mark.slow
def test_the_guard_trains_on_after_a_step_failed_beside_a_queued_shortcut(demo_data):
    """``on_oom='microbatch'``: the same failure in ``MicrobatchDDP.train_step``, whose
    gradients are kept in one flat buffer, so the limit leaves less room above the start than
    in a trial: the step is redone in smaller micro-batches under the same limit and trains,
    and the rank ends where it started. Before the fix what stayed queued left room for
    micro-batches of 1 sample only (with oneDNN's convolutions: not even for those)."""
    r = _report('guard', SHORTCUT, demo_data)
    assert r['cap'] is not None and r['forward_done'], r
    assert r['trained'] is True, r
    assert 1 < r['micro_batches'] < r['batch'], r  # never down to 1 sample (before the fix)
    assert r['after'] - r['before'] <= (r['cap'] - r['before']) / 10, r
