"""``PatientEvaluator``: two real gloo ranks in processes of their own, a metric that keeps rank 0
busy for three times the process group's collective timeout. MMEngine's ``Evaluator`` loses the
waiting rank to the timeout; ours returns the same metrics on both ranks, computed from both
ranks' results. The demo trained under ``dist_train.sh`` with such a metric:
``tests/e2e/test_slow_metric.py``."""
import os
import os.path as osp
import time
import traceback
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from mmengine.evaluator import BaseMetric, Evaluator

from mmddp_ext.runner.evaluation import PatientEvaluator, keeps_stock_evaluate, to_cpu

from preloaded import fork_server

COLLECTIVE_TIMEOUT = 2.0  # seconds: the process group's, far below rank 0's computation


class SumMetric(BaseMetric):
    """The sum of every rank's results; rank 0 computes for ``busy`` seconds (or raises)."""

    def __init__(self, busy: float = 0.0, fail: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.busy, self.fail = busy, fail

    def process(self, data_batch, data_samples) -> None:
        self.results.extend(data_samples)

    def compute_metrics(self, results: list) -> dict:
        time.sleep(self.busy)
        if self.fail:
            raise RuntimeError('the metric failed on rank 0')
        return dict(total=float(sum(results)), order=','.join(f'{r:g}' for r in results))


class OwnEvaluate(SumMetric):
    """A metric with its own ``evaluate``: called as it is."""

    def evaluate(self, size: int) -> dict:
        return dict(own=1.0)


def _rank(rank: int, store: str, kind: str, metric_kwargs: dict, out: str) -> None:
    result = {}
    os.chdir(out)  # MMEngine's Evaluator collects through .dist_test/ in the working directory
    try:
        dist.init_process_group('gloo', init_method=f'file://{store}', rank=rank, world_size=2,
                                timeout=timedelta(seconds=COLLECTIVE_TIMEOUT))
        metric = SumMetric(prefix='sum', **(metric_kwargs if rank == 0 else {}))
        evaluator = (
            PatientEvaluator([metric, OwnEvaluate()], wait_timeout=120)
            if kind == 'patient' else Evaluator([metric]))
        # rank r holds samples r, r + 2, ...: 5 samples, the sampler's padding to 6 dropped
        evaluator.process(data_samples=[float(rank), float(rank + 2), float(rank + 4)])
        result['metrics'] = evaluator.evaluate(size=5)
        result['left'] = len(metric.results)
    except Exception as e:  # the parent reads what went wrong
        result['error'] = f'{type(e).__name__}: {e}\n{traceback.format_exc()}'
    result['end'] = time.monotonic()
    torch.save(result, osp.join(out, f'rank{rank}.pt'))


def _two_ranks(tmp_path, kind: str, **metric_kwargs) -> dict:
    ctx = fork_server()  # each rank a process of its own, the stack imported already
    procs = [
        ctx.Process(target=_rank,
                    args=(r, str(tmp_path / 'store'), kind, metric_kwargs, str(tmp_path)))
        for r in (0, 1)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
        assert p.exitcode is not None, 'a rank did not finish in 300 s'
    return {r: torch.load(str(tmp_path / f'rank{r}.pt')) for r in (0, 1)}


@pytest.mark.slow
def test_the_waiting_rank_outlasts_the_collective_timeout(tmp_path):
    out = _two_ranks(tmp_path, 'patient', busy=3 * COLLECTIVE_TIMEOUT)
    for rank in (0, 1):
        assert 'error' not in out[rank], out[rank]['error']
        # samples 0..4 of both ranks in the sampler's order, the padded sample 5 dropped
        assert out[rank]['metrics'] == {'sum/total': 10.0, 'sum/order': '0,1,2,3,4', 'own': 1.0}
        assert out[rank]['left'] == 0  # results cleared for the next validation


@pytest.mark.slow
def test_mmengines_evaluator_loses_the_waiting_rank_to_the_timeout(tmp_path):
    """The control: the same metric and timeout with MMEngine's Evaluator."""
    out = _two_ranks(tmp_path, 'stock', busy=3 * COLLECTIVE_TIMEOUT)
    assert 'error' in out[1] and 'metrics' not in out[1]


@pytest.mark.slow
def test_a_metric_that_raises_on_rank_0_ends_the_wait_at_once(tmp_path):
    out = _two_ranks(tmp_path, 'patient', fail=True)
    assert 'the metric failed on rank 0' in out[0]['error']
    assert 'error' in out[1]  # rank 0 is gone: no 120 s wait (the join above bounds it)
    assert out[1]['end'] - out[0]['end'] < 120


def test_one_process_evaluates_as_mmengine_does():
    metric = SumMetric(prefix='sum')
    evaluator = PatientEvaluator([metric, OwnEvaluate()])
    evaluator.process(data_samples=[1.0, 2.0, 3.0])
    assert evaluator.evaluate(size=2) == {'sum/total': 3.0, 'sum/order': '1,2', 'own': 1.0}


def test_which_metrics_it_evaluates_itself():
    assert keeps_stock_evaluate(SumMetric())
    assert not keeps_stock_evaluate(OwnEvaluate())
    assert not keeps_stock_evaluate(object())


def test_bad_wait_is_refused_with_the_value():
    with pytest.raises(ValueError, match=r'wait_timeout=0.*positive number of seconds'):
        PatientEvaluator([SumMetric()], wait_timeout=0)
    assert PatientEvaluator([SumMetric()], wait_timeout=lambda: 7).wait_seconds() == 7.0


def test_tensors_in_results_reach_the_cpu_in_their_containers():
    moved = to_cpu([{'a': torch.ones(2)}, (torch.zeros(1), 3)])
    assert moved[0]['a'].device.type == 'cpu' and isinstance(moved[1], tuple)
    assert moved[1][1] == 3
