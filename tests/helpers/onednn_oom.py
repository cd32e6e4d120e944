"""Test-only: out-of-memory errors under an address-space limit with and without oneDNN (torch's
CPU convolutions), on the demo pose model.

Usage: ``python onednn_oom.py MODE DATA_ROOT [ONEDNN [LIMITS]]`` with MODE ``control`` (plain steps,
nothing of the product's recovery), ``trials`` (the finder's trial, :meth:`Trials.run`) or
``guard`` (``MicrobatchDDP.train_step`` in one process). After warm-up steps, steps at ``BATCH``
run under an address-space limit of the size before the step + ROOM, ROOM going down 2 MiB at
a time (or in ``LIMITS`` even steps of at least 2 MiB), until one of them fails inside oneDNN
(``could not create a primitive``; the others fail in torch's allocator, or fit), or down to
1 MiB. ONEDNN ``on`` (the default): as under a
limit of the user's own (``ulimit -v``); ``budget``: off, as ``scaling.memory_budget_mib``
leaves it. Then, with the limit lifted, one more step at ``BATCH // 8``: whether it trains.
Prints ``report {json}``; a native crash (oneDNN's kernels can segfault after a failed
allocation) shows where, on stderr.
"""
import faulthandler
import json
import re
import resource
import sys

import torch

import mmddp_ext.batch_finder.trials as trials_module
import mmddp_ext.ddp.microbatch as microbatch
from mmddp_ext.oom.onednn import PRIMITIVE_FAILURE

from tests.helpers.demo_trials import demo_trials
from tests.helpers.proc_status import proc_status

BATCH = 32
MIB = 2**20
messages = []


def _spy(predicate):
    """The product's out-of-memory predicate, noting each message it is asked about."""

    def spied(exc):
        messages.append(str(exc))
        return predicate(exc)

    return spied


def vm_size() -> int:
    return proc_status('VmSize')['VmSize']


def limit(room):
    soft = resource.RLIM_INFINITY if room is None else vm_size() + room
    resource.setrlimit(resource.RLIMIT_AS, (soft, resource.RLIM_INFINITY))


def main(mode: str, data_root: str, onednn: str = 'on', limits: str = '0') -> None:
    faulthandler.enable()  # a native crash under the limit shows where
    trials = demo_trials(data_root, BATCH, mode == 'guard')
    # a budget turns oneDNN off; a limit of the user's own (``ulimit -v``) leaves it on
    torch.backends.mkldnn.enabled = onednn == 'on'
    assert trials.run(BATCH // 8).fits and trials.run(BATCH).fits  # optimizer state, caches
    trials_module.is_oom_error = _spy(trials_module.is_oom_error)
    microbatch.is_oom_error = _spy(microbatch.is_oom_error)

    def step(batch):
        if mode == 'trials':
            return trials.run(batch).fits
        if mode == 'guard':
            try:
                trials.net.train_step(trials.collate(trials.samples[:batch]), trials.optim_wrapper)
                return True
            except Exception as e:  # noqa: B902 - the guard gave up: reported
                messages.append(str(e))
                return False
        try:
            trials._step(batch)
            return True
        except Exception as e:  # noqa: B902 - what failed is the result
            messages.append(str(e))
            return False
        finally:
            trials.optim_wrapper.zero_grad()

    report = dict(tried=[], errors=[])
    status = proc_status('VmSize', 'VmPeak')
    top = (status['VmPeak'] - status['VmSize']) // MIB + 10  # above what a step at BATCH takes
    stride = max(2, -(-top // int(limits))) if int(limits) else 2
    report['stride'] = stride
    for room in range(top, 0, -stride):
        messages.clear()
        limit(room * MIB)
        fitted = step(BATCH)
        limit(None)
        report['tried'].append(room)
        for kind in (re.sub(r'\d+', 'N', m[:100]) for m in messages):  # the kinds of error
            if kind not in report['errors']:
                report['errors'].append(kind)
        if any(PRIMITIVE_FAILURE in m for m in messages):
            report.update(room_mib=room, fitted=fitted)
            break
    report['onednn_failed'] = 'room_mib' in report
    report['next_trains'] = step(BATCH // 8)
    report['onednn_on'] = torch.backends.mkldnn.enabled
    report['last_messages'] = [m[:120] for m in messages[-3:]]
    report['tried'] = f'{report["tried"][0]}..{report["tried"][-1]}'
    print('report ' + json.dumps(report), flush=True)


if __name__ == '__main__':
    main(*sys.argv[1:5])
