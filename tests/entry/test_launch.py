"""``mmddp_ext.LaunchFailed``: torch's real ChildFailedError, as the agent raises it when it saw
the rank that only lost its peer end first, with the failure records the real
``record_failure`` writes: the rank that raised is named, torch's report is kept."""
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from mmddp_ext import LaunchFailed
from mmddp_ext.diagnose.records import record_failure


def _raised(exc):
    try:
        raise exc
    except RuntimeError as e:
        return e


def test_the_rank_that_raised_is_named_when_torch_saw_its_peer_first(tmp_path):
    work = str(tmp_path)
    record_failure(work, 1, _raised(RuntimeError('injected fault on rank 1 at iteration 2')))
    record_failure(
        work, 0,
        _raised(
            RuntimeError(
                '[gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:9432')))
    torch_error = ChildFailedError(
        'worker_main', {0: ProcessFailure(local_rank=0, pid=123, exitcode=1, error_file='<N/A>')})

    error = LaunchFailed(torch_error, work)

    assert isinstance(error, ChildFailedError)  # `except ChildFailedError` still catches it
    assert error.rank_at_fault == 1
    assert list(error.failures) == [0] and error.failures[0].exitcode == 1  # torch's, as it was
    text = str(error)
    assert text.startswith('rank 1 failed first; ==== mmddp_ext diagnosis of')
    assert 'first failing rank: 1' in text and 'injected fault on rank 1' in text
    assert 'worker_main FAILED' in text  # torch's own report follows
