"""``python -m mmddp_ext.diagnose``: the summary of failure records written by the real
``record_failure`` (in-process), classified by the one out-of-memory classifier."""
import json
import os.path as osp

from mmddp_ext import failures
from mmddp_ext.diagnose import summarize
from mmddp_ext.memory import oom as oom_module

PLAN = dict(per_device_batch_size=16, world_size=2, accumulative_counts=2,
            global_batch_size=64)


def _raise(exc):
    try:
        raise exc
    except Exception as e:  # noqa: B902 - the record takes whatever was raised
        return e


def test_onednn_failure_under_a_budget_is_diagnosed_as_out_of_memory(tmp_path, monkeypatch):
    """The failure of the finder's batch in the field: oneDNN cannot allocate under the
    address-space limit. The record says out of memory, and so does the diagnosis, with the
    advice for it."""
    monkeypatch.setattr(failures, 'address_space_limit', lambda: 3 * 2 ** 30)
    monkeypatch.setattr(oom_module, 'address_space_limit', lambda: 3 * 2 ** 30)
    work = str(tmp_path)
    failures.record_failure(work, 1, _raise(RuntimeError('could not create a primitive')),
                            dict(plan=PLAN, memory_budget_mib=1030))
    record = json.load(open(osp.join(work, 'failures', 'rank1.json')))
    assert record['oom'] is True and record['address_space_limit'] == 3 * 2 ** 30
    text = summarize(work)
    assert 'first failing rank: 1' in text
    assert 'out of memory on rank 1' in text
    assert 'cause: out of memory at per-device batch 16' in text
    assert 'fix: --cfg-options scaling.max_batch_per_device=8' in text


def test_same_message_without_a_limit_is_not_called_out_of_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(failures, 'address_space_limit', lambda: None)
    monkeypatch.setattr(oom_module, 'address_space_limit', lambda: None)
    failures.record_failure(str(tmp_path), 0, _raise(RuntimeError('could not create a primitive')))
    text = summarize(str(tmp_path))
    assert 'RuntimeError: could not create a primitive' in text
    assert 'out of memory' not in text


def test_old_records_without_the_flag_are_classified_from_their_text(tmp_path):
    record = dict(rank=0, time=1.0, exc_type='RuntimeError', plan=PLAN,
                  message="DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 "
                          "bytes")
    text = summarize(str(tmp_path), [record])
    assert 'out of memory on rank 0' in text and 'fit: per-device batch' in text


def test_failure_records_are_written_atomically(tmp_path):
    path = failures.record_failure(str(tmp_path), 3, _raise(ValueError('bad')))
    assert osp.basename(path) == 'rank3.json'
    assert sorted(p.name for p in (tmp_path / 'failures').iterdir()) == [
        'rank3.json', 'rank3.traceback.txt']  # no temporary file left behind
