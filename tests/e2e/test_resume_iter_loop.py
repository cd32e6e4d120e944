"""An iteration-based demo run (``IterBasedTrainLoop`` with ``InfiniteSampler``, as
MMSegmentation's and many MMDetection configs train), 2 ranks by hand (forked from the
preloaded stack, ``tests/preloaded.py``) with the demo's own
DataLoader workers, told to stop by SIGTERM to every process: it saves after the agreed
iteration, exits 75, and ``--resume`` trains the rest with the batches a run that was never
stopped trained, each once, without loading any sample of the iterations already trained
(MMEngine 0.10.7 loads and drops them: 1,088 samples for 15 iterations of 32 in the issue)."""
import os.path as osp
import signal
from collections import Counter

import pytest

from conftest import DEMO_WORKERS, demo_options, demo_with_hooks, finish
from preloaded import by_hand
from tests.helpers.load_record import loads
from tests.helpers.stop_point_hook import (STOP_OPTIONS, hook_source, job_processes,
                                           trained_iterations, wait_for)

pytestmark = pytest.mark.slow

ITERS, HELD = 16, 10  # held after 10: the stop lands after 12 (the agreement's lag)


def _config(tmp_path, flags: str, records: str, held: int, max_iters: int) -> str:
    config = demo_with_hooks(tmp_path, hook_source(flags, held), ['stop_point_hook', 'load_record'],
                             f'iter_{held}.py')
    with open(config, 'a') as f:
        f.write(f"train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters={max_iters},"
                " val_interval=1000)\n"
                "log_processor = dict(by_epoch=False)\n"
                "default_hooks = dict(checkpoint=dict(by_epoch=False, interval=1000))\n"
                "_inner = dict(_base_.train_dataloader.dataset)\n"
                "train_dataloader = dict(sampler=dict(type='InfiniteSampler', shuffle=True), "
                f"dataset=dict(_delete_=True, type='LoadRecordingDataset', record_dir={records!r},"
                " dataset=_inner))\n")
    return config


def _by_hand(config: str, work: str, data: str, max_iters: int, extra=()) -> list:
    """The 2 ranks, started by hand from the preloaded stack, with the demo's workers; the
    epoch options of ``demo_options`` left out (an iteration-based loop takes none)."""
    options = [
        o for o in demo_options(data, **STOP_OPTIONS, **DEMO_WORKERS)
        if not o.startswith('train_cfg.max_epochs=')
    ] + [f'train_cfg.max_iters={max_iters}']
    return by_hand([config, '--work-dir', work, *extra, *options], work + '_ranks')


def test_sigterm_under_iter_based_loop_resumes_at_the_sampler(demo_data, tmp_path):
    # what a run that is never stopped trains and loads, 4 iterations past the end: the
    # loader asks its 2 workers for up to 4 batches ahead
    ref = tmp_path / 'ref'
    ref.mkdir()
    config = _config(ref, str(ref / 'flags'), str(ref / 'loads'), 0, ITERS + 4)
    results = finish(_by_hand(config, str(ref / 'w'), demo_data, ITERS + 4))
    assert [rc for rc, _ in results] == [0, 0], results[0][1][-3000:]
    reference = trained_iterations(str(ref / 'flags'), 2)

    flags, records, work = str(tmp_path / 'flags'), str(tmp_path / 'loads'), str(tmp_path / 'w')
    config = _config(tmp_path, flags, records, HELD, ITERS)
    procs = _by_hand(config, work, demo_data, ITERS)
    alive = lambda: all(p.poll() is None for p in procs)  # noqa: E731
    wait_for([osp.join(flags, f'paused_rank{r}') for r in (0, 1)], alive=alive)
    for process in job_processes(procs):  # each rank and its workers
        process.send_signal(signal.SIGTERM)
    wait_for([osp.join(flags, f'received_rank{r}') for r in (0, 1)], alive=alive)
    open(osp.join(flags, 'go'), 'w').close()
    results = finish(procs)
    out = results[0][1]
    assert [rc for rc, _ in results] == [75, 75], out[-3000:]
    assert f'saved {work}/iter_12.pth' in out, out[-3000:]
    before = {r: len(loads(records, r)) for r in (0, 1)}

    results = finish(_by_hand(config, work, demo_data, ITERS, ['--resume']))
    out = results[0][1]
    assert [rc for rc, _ in results] == [0, 0], out[-3000:]
    assert 'resuming after iteration 12 of 16: continuing at iteration 13' in out
    assert 'loading and dropping' not in out
    trained = trained_iterations(flags, 2)
    for rank in (0, 1):
        # every iteration once over the two runs, with the samples of the run never stopped
        assert [it for it, _, _ in trained[rank]] == list(range(1, ITERS + 1))
        assert [ids for _, _, ids in trained[rank]] == [ids
                                                        for _, _, ids in reference[rank]][:ITERS]
        # the resumed run loaded what it trained, and nothing else but what comes after it
        resumed = Counter(loads(records, rank)[before[rank]:])
        later = Counter(i for _, _, ids in reference[rank][12:] for i in ids)
        assert not Counter(i for _, _, ids in reference[rank][12:ITERS] for i in ids) - resumed
        assert not resumed - later, (sorted(resumed - later), 'loaded but trained before')
