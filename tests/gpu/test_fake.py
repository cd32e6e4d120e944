"""The fake GPU host behaves as CUDA and NVML do where the package relies on it."""
import json
import os
import subprocess
import sys

import pytest

from mmddp_ext.gpu import FAKE_ENV, gpus, use_gpus
from mmddp_ext.gpu.fake import FIELD_CONTEXT, FIELD_FOREIGN, FakeGpus, make_fake_host

MIB = 2**20


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A 2-GPU fake host with the user's foreign process on GPU 0; active in this process."""
    monkeypatch.delenv('CUDA_VISIBLE_DEVICES', raising=False)
    make_fake_host(str(tmp_path), count=2, foreign=[(0, 4242, FIELD_FOREIGN)])
    fake = FakeGpus(str(tmp_path))
    previous = use_gpus(fake)
    yield fake
    use_gpus(previous)


def rows(fake, physical):
    return dict(fake.process_table(physical)[1])


def test_a_query_before_the_pin_leaves_a_context_on_gpu_0(host):
    assert not host.initialized()
    host.mem_get_info(0)  # e.g. a rank that reads memory before torch.cuda.set_device
    host.set_device(1)
    me = os.getpid()
    assert me in rows(host, 0) and me in rows(host, 1)
    assert host.touched == [0, 1]


def test_the_pin_alone_touches_only_its_device(host):
    host.set_device(1)
    assert os.getpid() not in rows(host, 0) and os.getpid() in rows(host, 1)
    assert rows(host, 0) == {4242: FIELD_FOREIGN}  # the foreign process stays where it is


def test_free_memory_counts_every_process_on_the_device(host):
    """This process's row follows its live RSS, which may move by a page between two reads:
    the invariant is checked on reads between which it held still."""
    host.set_device(0)
    for _ in range(100):
        before = sum(rows(host, 0).values())
        free, total = host.mem_get_info(0)
        if sum(rows(host, 0).values()) == before:
            break
    else:
        pytest.fail('the process\'s memory never held still over three reads')
    assert total - free == before
    assert total - free >= FIELD_FOREIGN + FIELD_CONTEXT


GROWTH = """
import json, sys, torch
from mmddp_ext.gpu import gpus
g = gpus()
g.set_device(0)
before = g.allocated(0)
block = torch.ones(64 * 2**20, dtype=torch.uint8)  # written: resident
grown = g.allocated(0) - before
del block
high = g.peak(0)
g.reset_peak(0)
print(json.dumps(dict(before=before, grown=grown, high=high, after=g.peak(0),
                      other=g.allocated(1))))
"""


def test_allocations_grow_with_what_the_caller_allocates_and_peaks_reset(tmp_path):
    """In a fresh process: there, no freed memory of the host's allocator is reused, so the
    block's pages are new resident memory."""
    make_fake_host(str(tmp_path), count=2)
    out = subprocess.run([sys.executable, '-c', GROWTH], env=dict(os.environ,
                                                                  **{FAKE_ENV: str(tmp_path)}),
                         stdout=subprocess.PIPE, text=True, timeout=300, check=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got['grown'] >= 64 * MIB * 0.95
    assert got['high'] >= got['before'] + 64 * MIB * 0.95
    assert got['after'] < got['high']  # the peak was reset
    assert got['other'] == 0  # nothing was put on GPU 1


def test_pool_keeps_the_peak_until_empty_cache(host):
    host.set_device(0)
    host.hold(0, 32 * MIB)
    pooled = host.reserved(0)
    host.release(0, 32 * MIB)
    assert host.reserved(0) >= pooled  # the caching allocator keeps its blocks
    assert pooled % (2 * MIB) == 0 and pooled >= 32 * MIB
    assert host.peak(0) >= 32 * MIB  # and the peak remembers them until a reset
    host.empty_cache()
    assert host.reserved(0) < pooled


def test_hold_puts_tensors_on_another_device_as_torch_load_without_map_location(host):
    host.set_device(1)
    host.hold(0, 512 * MIB)
    assert host.allocated(0) == 512 * MIB
    assert rows(host, 0)[os.getpid()] >= 512 * MIB + FIELD_CONTEXT


def test_cuda_visible_devices_remaps_to_physical(host, monkeypatch):
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '1')
    assert host.count() == 1
    host.set_device(0)
    assert os.getpid() in rows(host, 1) and os.getpid() not in rows(host, 0)
    with pytest.raises(RuntimeError, match='invalid device ordinal 1'):
        host.set_device(1)


def test_other_processes_rows_come_and_go(host, tmp_path):
    child = subprocess.Popen([
        sys.executable, '-c', 'import sys; from mmddp_ext.gpu import gpus; '
        'gpus().set_device(1); print("up", flush=True); sys.stdin.read()'
    ], env=dict(os.environ, **{FAKE_ENV: str(tmp_path)}), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == 'up'
        assert child.pid in rows(host, 1)
    finally:
        child.stdin.close()
        child.wait(timeout=120)
    assert child.pid not in rows(host, 1)  # NVML lists running processes only


def test_without_nvml_tables_cannot_be_read(tmp_path):
    make_fake_host(str(tmp_path), nvml=False)
    fake = FakeGpus(str(tmp_path))
    assert not fake.nvml_available()
    with pytest.raises(RuntimeError, match='NVML is not available'):
        fake.process_table(0)


def test_the_environment_selects_the_fake(tmp_path, monkeypatch):
    env = make_fake_host(str(tmp_path), count=3)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    previous = use_gpus(None)
    try:
        assert isinstance(gpus(), FakeGpus) and gpus().count() == 3
        assert not gpus().tensors_on_gpu()
    finally:
        use_gpus(previous)


def test_a_folder_without_a_host_is_named(tmp_path):
    with pytest.raises(RuntimeError, match=f'{FAKE_ENV}=.*names no fake GPU host'):
        FakeGpus(str(tmp_path / 'missing'))
