"""ResumableIterLoop, in-process on MMEngine's toy runner with a dataset of 64 samples (batch 4:
16 batches per pass) that records every sample it loads: a resume at iteration N trains the
batches a run that was never stopped trained after N, and loads no sample of the batches before
N, with and without DataLoader workers (whose prefetch loads a few batches ahead)."""
import copy
import os.path as osp

import pytest
import torch
from mmengine.hooks import Hook
from mmengine.registry import DATA_SAMPLERS, DATASETS
from mmengine.runner import IterBasedTrainLoop, Runner
from mmengine.testing import RunnerTestCase
from torch.utils.data import Dataset

from mmddp_ext.runner import ResumableInfiniteSampler, ResumableIterLoop, ResumableSampler

SAMPLES, BATCH = 64, 4


@DATASETS.register_module(force=True)
class RecordedLoadsToyDataset(Dataset):
    """Sample ``i`` is ``[i / 64] * 2``; each load appends ``i`` to ``record`` (workers too)."""
    metainfo: dict = {}

    def __init__(self, record: str) -> None:
        self.record = record

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> dict:
        with open(self.record, 'a') as f:
            f.write(f'{index}\n')
        return dict(inputs=torch.tensor([index / SAMPLES] * 2), data_samples=torch.tensor(1.0))


@DATA_SAMPLERS.register_module(force=True)
class OwnSampler(torch.utils.data.Sampler):
    """A sampler of the user's own: it cannot skip, so the loop loads and drops."""

    def __init__(self, dataset, seed=None) -> None:
        self.size = len(dataset)

    def __iter__(self):
        return iter(range(self.size))

    def __len__(self) -> int:
        return self.size


class _Record(Hook):
    """The sample indices of each trained iteration."""

    def __init__(self) -> None:
        self.batches = []

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self.batches.append(tuple(round(float(x[0]) * SAMPLES) for x in data_batch['inputs']))


def _loads(record: str) -> list:
    with open(record) as f:
        return [int(line) for line in f]


class TestResumableIterLoop(RunnerTestCase):

    def _cfg(self, name: str, max_iters: int, sampler: str, workers: int, **extra):
        cfg = copy.deepcopy(self.iter_based_cfg)
        work = osp.join(self.temp_dir.name, name)
        cfg.train_dataloader = dict(
            dataset=dict(type='RecordedLoadsToyDataset', record=work + '_loads.txt'),
            sampler=dict(type=sampler, shuffle=True) if sampler != 'OwnSampler' else dict(
                type=sampler), batch_size=BATCH, num_workers=workers, persistent_workers=workers
            > 0)
        cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=1000)
        cfg.default_hooks = dict(checkpoint=dict(type='CheckpointHook', interval=4, by_epoch=False))
        cfg.randomness = dict(seed=0)
        cfg.work_dir = work
        cfg.experiment_name = f'{self.experiment_name}_{name}'
        cfg.update(extra)
        return cfg

    def _train(self, cfg):
        from mmddp_ext.runner import DDPRunner
        runner = DDPRunner.from_cfg(cfg)
        record = _Record()
        runner.register_hook(record)
        runner.train()
        self.assertIsInstance(runner.train_loop, ResumableIterLoop)
        return runner, record.batches, _loads(cfg.train_dataloader['dataset']['record'])

    def _resume_loads_nothing_before(self, sampler: str, workers: int, start: int, stop: int):
        # the reference runs past `stop` by more than the prefetch, to know what may be loaded
        ahead = 2 * workers  # batches the loader asks its workers for in advance
        _, reference, _ = self._train(self._cfg('ref', stop + ahead + 1, sampler, workers))
        runner, resumed, loads = self._train(
            self._cfg('resumed', stop, sampler, workers, resume=True,
                      load_from=osp.join(self.temp_dir.name, 'ref', f'iter_{start}.pth')))
        self.assertEqual(resumed, reference[start:stop])
        after = [i for batch in reference[start:] for i in batch]  # trained or prefetched later
        trained = [i for batch in reference[start:stop] for i in batch]
        counts = lambda xs: {i: xs.count(i) for i in set(xs)}  # noqa: E731
        # every sample trained was loaded once, and nothing was loaded that comes before
        # iteration `start` in the reference stream (up to the prefetch after `stop`)
        self.assertTrue(all(counts(loads).get(i, 0) >= n for i, n in counts(trained).items()))
        self.assertTrue(
            all(counts(after).get(i, 0) >= n for i, n in counts(loads).items()), (loads, after))
        return runner

    def test_infinite_sampler_starts_at_the_next_iteration(self):
        runner = self._resume_loads_nothing_before('InfiniteSampler', 0, 8, 12)
        self.assertIsInstance(runner.train_dataloader.sampler, ResumableInfiniteSampler)

    def test_infinite_sampler_with_persistent_workers(self):
        runner = self._resume_loads_nothing_before('InfiniteSampler', 2, 8, 12)
        loader = runner.train_dataloader
        self.assertEqual((loader.num_workers, loader.persistent_workers), (2, True))
        self.assertIsInstance(loader.sampler, ResumableInfiniteSampler)

    def test_default_sampler_resumes_in_its_second_pass(self):
        # iteration 20 of a 16-batch pass: the second pass's own shuffle, 4 batches in
        runner = self._resume_loads_nothing_before('DefaultSampler', 2, 20, 24)
        self.assertIsInstance(runner.train_dataloader.sampler, ResumableSampler)

    def test_a_sampler_that_cannot_skip_loads_and_drops_and_says_so(self):
        _, reference, _ = self._train(self._cfg('ref', 12, 'OwnSampler', 0))
        runner, resumed, loads = self._train(
            self._cfg('resumed', 12, 'OwnSampler', 0, resume=True,
                      load_from=osp.join(self.temp_dir.name, 'ref', 'iter_8.pth')))
        self.assertEqual(resumed, reference[8:])
        self.assertEqual(len(loads), 12 * BATCH)  # the 8 batches before, dropped, and 4 trained
        with open(osp.join(runner.log_dir, f'{runner.timestamp}.log')) as f:
            self.assertIn(
                'the sampler (OwnSampler) cannot skip batches: loading and dropping '
                'the first 8', f.read())

    def test_built_as_mmengine_builds_its_loop_but_without_starting_the_loader(self):
        import psutil

        # the pids of this process's children: workers left by an earlier test may end
        # meanwhile, so new ones are counted, not all of them
        workers = lambda: {c.pid for c in psutil.Process().children()}  # noqa: E731
        cfg = self._cfg('theirs', 4, 'InfiniteSampler', 2)
        before = workers()
        theirs = Runner.from_cfg(copy.deepcopy(cfg)).build_train_loop(cfg.train_cfg)
        self.assertIs(type(theirs), IterBasedTrainLoop)
        started = workers() - before
        self.assertEqual(len(started), 2)  # its loader started: its workers load
        from mmddp_ext.runner import DDPRunner
        ours = self._cfg('ours', 4, 'InfiniteSampler', 2)
        loop = DDPRunner.from_cfg(copy.deepcopy(ours)).build_train_loop(ours.train_cfg)
        self.assertIsInstance(loop, ResumableIterLoop)
        self.assertEqual(set(vars(theirs)), set(vars(loop)))  # the same attributes
        self.assertFalse(workers() - before - started)  # no worker of ours: nothing is loaded
        self.assertIsNone(loop.dataloader_iterator)


@pytest.mark.parametrize('skip', [0, 5])
def test_each_pass_of_the_infinite_sampler_is_the_stream_from_its_start(skip):
    sampler = ResumableInfiniteSampler(list(range(10)), shuffle=True, seed=3)
    first = [i for _, i in zip(range(25), iter(sampler))]
    sampler.skip = skip
    again = [i for _, i in zip(range(25 - skip), iter(sampler))]
    assert again == first[skip:]
    assert [i for _, i in zip(range(25), iter(sampler))] == first  # the skip was for one pass
