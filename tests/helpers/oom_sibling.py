"""Test-only: a real out-of-memory error raised in the backward of the demo pose model at a
chosen module, while a sibling node of the same graph is queued (a residual block's
``downsample`` shortcut: its backward runs first, the main branch waits beside it).

Usage: ``python oom_sibling.py MODE MODULE DATA_ROOT`` with MODE ``trials`` (the finder's
trial, :meth:`Trials.run`) or ``guard`` (``MicrobatchDDP.train_step`` in one process). After
a warm-up step, a tensor hook on ``MODULE``'s output caps this process's address space at its
size + 1 MiB when the backward reaches it, and stays capped; the step at ``BATCH`` then fails
in torch's allocator for real. Prints ``report {json}``: the address space (``VmSize``) before
the step, at the cap and after the product's release, where the failure was raised, and what
ran next under the same cap (a trial at half the batch, or the guard's redone step).
"""
import json
import resource
import sys

from tests.helpers.demo_trials import demo_trials
from tests.helpers.proc_status import proc_status

BATCH = 64
MIB = 2**20


def vm_size() -> int:
    return proc_status('VmSize')['VmSize']


def main(mode: str, module: str, data_root: str) -> None:
    trials = demo_trials(data_root, BATCH, mode == 'guard')
    # optimizer state, caches, and the high-water mark a step at BATCH leaves where it fits
    # (torch's own CPU kernels under a budget keep one: 82 MiB at 64 samples, as after any
    # such step): the failed step is compared with a step that fitted
    assert trials.run(BATCH // 8).fits and trials.run(BATCH).fits

    seen = {'armed': False, 'forward_done': False, 'cap': None, 'optimizer_steps': 0}

    def cap(grad):
        if seen['armed']:
            seen['armed'] = False
            seen['cap'] = vm_size()
            resource.setrlimit(resource.RLIMIT_AS, (seen['cap'] + MIB, resource.RLIM_INFINITY))

    def on_output(mod, args, output):
        if seen['armed']:
            output.register_hook(cap)

    def on_last_stage(mod, args, output):
        if seen['armed']:  # the failing step's forward went through the backbone
            seen['forward_done'] = True

    def on_optimizer(optimizer, args, kwargs):
        seen['optimizer_steps'] += 1

    trials.model.get_submodule(module).register_forward_hook(on_output)
    trials.model.backbone.layer4.register_forward_hook(on_last_stage)
    trials.optim_wrapper.optimizer.register_step_pre_hook(on_optimizer)
    before = vm_size()
    seen['armed'] = True
    report = dict(before=before)
    if mode == 'trials':
        report['fits'] = trials.run(BATCH).fits
        report['after'] = vm_size()
        report['optimizer_steps'] = seen['optimizer_steps']  # in the failed trial
        report['half_fits'] = trials.run(BATCH // 2).fits
    else:
        net = trials.net
        data = trials.collate(trials.samples[:BATCH])
        try:
            net.train_step(data, trials.optim_wrapper)
            report['trained'] = True
        except Exception as e:  # noqa: B902 - reported, the test reads it
            report['trained'] = f'{type(e).__name__}: {e}'
        report['after'] = vm_size()
        report.update(micro_batches=net.micro_batches, batch=BATCH)
    report.update(cap=seen['cap'], forward_done=seen['forward_done'])
    print('report ' + json.dumps(report), flush=True)


if __name__ == '__main__':
    main(*sys.argv[1:4])
