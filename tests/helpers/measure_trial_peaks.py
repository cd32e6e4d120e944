"""Measure, on this machine, the address space the batch finder's trials reach.

``python tests/helpers/measure_trial_peaks.py OUT.json SMALL LARGE CONFIG [dist_train args]``
loads the config as ``dist_train.py`` does (its ``custom_imports`` run, as in training), notes
the process's virtual size then (where ``tests.helpers.limit_rank`` measures its limit from),
applies a loose budget (so glibc and oneDNN behave as under a real one), runs the finder's
warm-up step and then one trial of the finder (holding the reserve a tight rank holds) at
``SMALL`` and then at ``LARGE`` per-device samples, reading the kernel's peak virtual size
(``VmPeak``) after each (and the virtual size once the trials' model is built, ``built``, and
the peak of the warm-up step, ``warm_up``). A test places a rank's limit between the two, so that
the limit binds on whatever machine the test runs.
"""
import json
import sys

import psutil
import torch

from tests.helpers.proc_status import proc_status


def main() -> None:
    out, small, large, argv = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
    from mmddp_ext.entry.train import build_config, parse_args
    cfg = build_config(parse_args(argv))
    at_import = psutil.Process().memory_info().vms
    from mmddp_ext.batch_finder.trials import CPU_RESERVE_MIB, Trials
    from mmddp_ext.memory.budget import apply_budget
    apply_budget(64 * 1024, torch.device('cpu'))
    from mmengine.registry import init_default_scope
    init_default_scope(cfg.get('default_scope', 'mmengine'))
    # the reserve a tight rank holds during its trials (the minimum one on a CPU)
    trials = Trials(cfg, torch.device('cpu'), large, CPU_RESERVE_MIB * 2**20)
    built = proc_status('VmSize')['VmSize']
    assert trials.fits(1), 'the warm-up step did not fit under a 64 GiB budget'
    peaks = dict(built=built, warm_up=proc_status('VmPeak')['VmPeak'])
    for batch in (small, large):
        assert trials.fits(batch), f'a trial at {batch} did not fit under a 64 GiB budget'
        peaks[batch] = proc_status('VmPeak')['VmPeak']
    with open(out, 'w') as f:
        json.dump(
            dict(at_import=at_import, built=peaks['built'], warm_up=peaks['warm_up'],
                 small=peaks[small], large=peaks[large]), f)


if __name__ == '__main__':
    main()
