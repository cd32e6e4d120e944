"""The package's GPU branches, in-process on the fake host: the pin, the memory sample, the
budget, what the finder compares, the wrapper and the launcher's GPU count."""
import os

import pytest
import torch

from mmddp_ext.ddp.process_group import pin_device
from mmddp_ext.ddp.wrapper import model_wrapper_for
from mmddp_ext.gpu import use_gpus
from mmddp_ext.gpu.fake import FakeGpus, make_fake_host
from mmddp_ext.launcher.layout import read_launch_env
from mmddp_ext.memory.budget import apply_budget, held_bytes
from mmddp_ext.memory.stats import MemoryReader
from mmddp_ext.runner.ddp_runner import _world_size

MIB = 2**20


@pytest.fixture
def fake(tmp_path, monkeypatch):
    for key in ('CUDA_VISIBLE_DEVICES', 'RANK', 'LOCAL_RANK', 'WORLD_SIZE'):
        monkeypatch.delenv(key, raising=False)
    make_fake_host(str(tmp_path), count=2)
    gpus = FakeGpus(str(tmp_path))
    previous = use_gpus(gpus)
    yield gpus
    use_gpus(previous)


def test_pin_makes_the_local_rank_s_gpu_current_and_touches_nothing_else(fake):
    assert pin_device(1) == 1
    assert fake.current() == 1 and fake.touched == [1]


def test_sample_reads_the_device_and_keeps_a_peak_that_a_reset_does_not_lose(fake):
    pin_device(1)
    reader = MemoryReader(0, 'cuda:1')
    fake.hold(1, 128 * MIB)  # exact bytes: the host allocator's reuse does not blur them
    fake.release(1, 128 * MIB)
    sample = reader.read(1)
    assert sample.device == 'cuda:1' and sample.device_total == fake.mem_get_info(1)[1]
    assert sample.peak_allocated >= 128 * MIB * 0.95
    assert sample.reserved >= sample.allocated
    fake.reset_peak(1)  # what MMEngine's LogProcessor does to torch's counter when it logs
    assert fake.peak(1) < 128 * MIB
    assert reader.read(2).peak_allocated >= 128 * MIB * 0.95  # our running peak survives


def test_budget_caps_the_share_of_the_device(fake):
    pin_device(1)
    total = fake.mem_get_info(1)[1]
    budget = apply_budget(6000, torch.device('cuda', 1))
    assert fake.fractions == {1: pytest.approx(6000 * MIB / total)}
    assert budget.device == 'cuda:1' and budget.nbytes == 6000 * MIB
    assert 'capped at scaling.memory_budget_mib=6000' in budget.how


def test_without_a_budget_the_free_memory_is_the_budget(fake):
    pin_device(0)
    budget = apply_budget(None, torch.device('cuda', 0))
    free, _ = fake.mem_get_info(0)
    assert abs(budget.nbytes - free) <= 2 * MIB  # the process may grow between the reads
    assert fake.fractions == {}


def test_held_bytes_on_a_gpu_are_its_allocated_bytes(fake):
    pin_device(0)
    fake.hold(0, 64 * MIB)
    held = held_bytes(torch.device('cuda', 0))
    assert 64 * MIB <= held <= fake.allocated(0)


def test_wrapper_decides_the_rank_s_device_and_gives_torch_none_on_the_fake(fake):
    from mmengine.config import Config

    from mmddp_ext.ddp.wrapper import with_rank_device
    pin_device(1)
    wrapper = model_wrapper_for(Config(dict(model=dict(type='X'))), True)
    assert wrapper['device_ids'] is None  # in the config: the same on every rank
    built, note = with_rank_device(wrapper)
    assert built['device_ids'] is None  # the fake's ranks compute on the CPU (gloo)
    assert note == ('fake GPU host: DDP device_ids [1] as on a GPU; None used (its tensors stay '
                    'on the CPU)')
    assert with_rank_device(dict(wrapper, type='MicrobatchDDP')) == (  # takes no device ids
        dict(wrapper, type='MicrobatchDDP'), None)
    assert with_rank_device(dict(wrapper, device_ids=[0])) == (dict(wrapper, device_ids=[0]), None)


@pytest.mark.parametrize('count, local', [(2, 1), (3, 0)])
def test_hand_set_variables_derive_local_rank_from_the_gpu_count(fake, monkeypatch, tmp_path, count,
                                                                 local):
    make_fake_host(str(tmp_path / 'h'), count=count)
    use_gpus(FakeGpus(str(tmp_path / 'h')))
    monkeypatch.setenv('RANK', '3')
    monkeypatch.setenv('WORLD_SIZE', '4')
    monkeypatch.setenv('MASTER_ADDR', '127.0.0.1')
    monkeypatch.setenv('MASTER_PORT', '29500')
    # rank 3 on a host of `count` GPUs, read by the one reader the runner asks
    assert (_world_size('pytorch'), read_launch_env('pytorch').local_rank) == (4, local)
    assert os.environ.get('LOCAL_RANK') is None  # read, not written


class _OnGpu(FakeGpus):
    """The fake host answering as a real GPU rank does: its tensors on the GPU."""

    def tensors_on_gpu(self) -> bool:
        return True


def _bn_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4))


def test_a_gpu_rank_is_given_its_device_at_wrap_time_and_keeps_its_syncbn(tmp_path):
    from mmengine.config import Config

    from mmddp_ext.ddp.wrapper import sync_bn_for_rank, with_rank_device
    make_fake_host(str(tmp_path), count=2)
    previous = use_gpus(_OnGpu(str(tmp_path)))
    try:
        pin_device(1)
        wrapper = model_wrapper_for(Config(dict(model=dict(type='X'))), True)
        assert 'device_ids' not in wrapper  # the config stays the same on every rank
        assert with_rank_device(wrapper) == (dict(wrapper, device_ids=[1]), None)
        model = _bn_model()
        assert sync_bn_for_rank(model, 'torch') == (model, None)  # MMEngine converts it
    finally:
        use_gpus(previous)


def test_the_fake_applies_sync_bn_as_a_gpu_rank_then_gives_its_cpu_batchnorm(fake):
    from mmddp_ext.ddp.wrapper import sync_bn_for_rank, sync_bn_layers
    model, note = sync_bn_for_rank(_bn_model(), 'torch')
    assert note == ('fake GPU host: SyncBN 1 layer(s) kept as on a GPU; BatchNorm used (its '
                    'tensors stay on the CPU)')
    assert sync_bn_layers(model) == 0 and fake.replacements == [note]
    plain = _bn_model()
    assert sync_bn_for_rank(plain, None) == (plain, None)  # nothing to keep, nothing replaced


def test_a_rank_without_gpus_trains_batchnorm_and_ignores_sync_bn(fake, monkeypatch):
    from mmddp_ext.ddp.wrapper import sync_bn_for_rank, sync_bn_layers
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '')  # as CUDA counts it: no GPU
    assert fake.count() == 0 and not fake.available()
    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(_bn_model())
    model, note = sync_bn_for_rank(model, 'torch')
    assert sync_bn_layers(model) == 0 and note == ("training on CPUs: sync_bn='torch' ignored "
                                                   '(SyncBN needs CUDA)')
    assert fake.replacements == []  # a CPU rank replaces no GPU decision
