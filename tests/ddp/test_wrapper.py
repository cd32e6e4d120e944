"""The DDP wrapper config (pure): lean defaults, the config's own keys win, other wrappers are
left alone, and MicrobatchDDP with on_oom='microbatch'; the wrapper a run builds
(``model_wrapper_for``, the one place it is decided)."""
import pytest
from mmengine.config import Config

from mmddp_ext.ddp.wrapper import buffer_sync_key, ddp_wrapper_cfg, model_wrapper_for
from mmddp_ext.errors import ScalingError

from conftest import mmengine_log


def _cfg(**extra) -> Config:
    return Config(dict(model=dict(type='ToyModel'), **extra))


@pytest.mark.parametrize('cuda,device_ids', [(True, {}), (False, {'device_ids': None})])
def test_lean_defaults(cuda, device_ids):
    # no device on a GPU: the config is compared across ranks, the device is given at wrap time
    wrapper = ddp_wrapper_cfg(_cfg(), cuda)
    assert wrapper == {
        'type': 'MMDistributedDataParallel',
        'find_unused_parameters': False,
        'gradient_as_bucket_view': True,
        **device_ids,
        buffer_sync_key(): False
    }


def test_the_configs_own_keys_win():
    own = dict(gradient_as_bucket_view=False, broadcast_buffers=True, bucket_cap_mb=50)
    wrapper = ddp_wrapper_cfg(_cfg(model_wrapper_cfg=own, find_unused_parameters=True), False)
    assert wrapper['gradient_as_bucket_view'] is False and wrapper['bucket_cap_mb'] == 50
    assert wrapper['find_unused_parameters'] is True
    assert wrapper['broadcast_buffers'] is True and 'forward_sync_buffers' not in wrapper


def test_microbatch_guard():
    wrapper = ddp_wrapper_cfg(_cfg(), False, on_oom='microbatch')
    assert wrapper['type'] == 'MicrobatchDDP' and wrapper['broadcast_buffers'] is False


def test_other_wrappers_are_left_alone_unless_the_guard_needs_ddp():
    fsdp = dict(type='MMFullyShardedDataParallel', cpu_offload=True)
    assert ddp_wrapper_cfg(_cfg(model_wrapper_cfg=fsdp), True) == fsdp
    with pytest.raises(ScalingError, match="model_wrapper_cfg.type='MMFullyShardedDataParallel'"):
        ddp_wrapper_cfg(_cfg(model_wrapper_cfg=fsdp), True, on_oom='microbatch')


@pytest.mark.parametrize(
    'distributed, on_oom, expected_type',
    [
        (True, 'raise', 'MMDistributedDataParallel'),
        (True, 'microbatch', 'MicrobatchDDP'),
        (False, 'microbatch', 'MicrobatchDDP'),  # the guard holds in one process too
        (False, 'raise', None),  # one process, no guard: MMEngine's own (no wrapper)
    ])
def test_model_wrapper_for_a_run(distributed, on_oom, expected_type):
    wrapper = model_wrapper_for(_cfg(), distributed, on_oom)
    assert (wrapper or {}).get('type') == expected_type
    if distributed:
        assert wrapper['gradient_as_bucket_view'] is True


def test_a_default_guard_gives_way_to_the_configs_own_wrapper():
    fsdp = dict(type='MMFullyShardedDataParallel')
    with mmengine_log() as logged:
        assert model_wrapper_for(
            _cfg(model_wrapper_cfg=fsdp), True, 'microbatch', guard_by_default=True) == fsdp
    assert any('is not guarded against running out of memory' in m for m in logged)
    with pytest.raises(ScalingError, match='needs a DDP model wrapper'):  # asked for: refused
        model_wrapper_for(_cfg(model_wrapper_cfg=fsdp), True, 'microbatch')


@pytest.mark.parametrize(
    'visible_gpus, extra, expected',
    [
        (2, {}, 1),  # no LOCAL_RANK: RANK % visible GPUs = 3 % 2
        (4, {}, 3),  # 3 % 4
        (4, dict(LOCAL_WORLD_SIZE='2'), 1),  # RANK % LOCAL_WORLD_SIZE = 3 % 2
        (4, dict(LOCAL_RANK='0'), 0),  # set: taken as it is, whatever RANK says
    ])
def test_the_wrapper_is_on_the_rank_s_derived_device(monkeypatch, tmp_path, visible_gpus, extra,
                                                     expected):
    """Hand-set variables and Slurm may lack LOCAL_RANK until the process group starts: the
    device DDP is given is the one derived from RANK and the node's layout, not GPU 0, through
    both places that read the variables (the entry's ``read_launch_env`` and DDPRunner's
    ``_layout``) and the pin of the process group's start. A host of ``visible_gpus`` GPUs is
    faked: its ranks decide as GPU ranks do, and give torch None (their tensors stay on the
    CPU), which the line says."""
    from mmddp_ext.ddp.process_group import pin_device
    from mmddp_ext.ddp.wrapper import with_rank_device
    from mmddp_ext.gpu import use_gpus
    from mmddp_ext.gpu.fake import FakeGpus, make_fake_host
    from mmddp_ext.launcher.layout import read_launch_env
    from mmddp_ext.runner.ddp_runner import _world_size
    for key in ('LOCAL_RANK', 'LOCAL_WORLD_SIZE', 'CUDA_VISIBLE_DEVICES'):
        monkeypatch.delenv(key, raising=False)
    for key, value in dict(RANK='3', WORLD_SIZE='8', MASTER_ADDR='h', MASTER_PORT='29500',
                           **extra).items():
        monkeypatch.setenv(key, value)
    make_fake_host(str(tmp_path), count=visible_gpus)
    previous = use_gpus(FakeGpus(str(tmp_path)))
    try:
        env = read_launch_env('pytorch')
        assert (env.local_rank, _world_size('pytorch')) == (expected, 8)
        pin_device(env.local_rank)
        wrapper, note = with_rank_device(model_wrapper_for(_cfg(), True))
        assert wrapper['device_ids'] is None and f'DDP device_ids [{expected}] as on a GPU' in note
    finally:
        use_gpus(previous)


def test_ddp_runner_reads_the_layout_through_the_one_reader(monkeypatch):
    from mmddp_ext.launcher.layout import read_launch_env
    from mmddp_ext.runner.ddp_runner import _world_size
    for key, value in dict(RANK='3', WORLD_SIZE='4', LOCAL_WORLD_SIZE='2', MASTER_ADDR='h',
                           MASTER_PORT='29500').items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv('LOCAL_RANK', raising=False)
    assert _world_size('pytorch') == 4
    assert read_launch_env('pytorch').local_rank == 1  # LOCAL_RANK = RANK % LOCAL_WORLD_SIZE
