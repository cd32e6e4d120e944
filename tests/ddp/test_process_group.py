"""``ensure_process_group``, the one way a run starts its process group, and ``join_job``,
which every runner calls once before it is built (the wrapper, then the group), in-process."""
import os

import pytest
import torch.distributed as dist
from mmengine.config import Config

from mmddp_ext.ddp.join import join_job
from mmddp_ext.ddp.process_group import choose_backend, ensure_process_group
from mmddp_ext.launcher.env import read_dist_env
from mmddp_ext.scaling.config import ScalingConfig
from mmddp_launch.rendezvous import find_free_port


def test_not_distributed_starts_nothing():
    assert ensure_process_group('none', dict(backend='nccl')) == []
    assert not dist.is_initialized()


@pytest.mark.parametrize('scaling, wrapper',
                         [(None, None), (ScalingConfig(on_oom='microbatch'), 'MicrobatchDDP')])
def test_joining_one_process_chooses_the_wrapper_and_starts_nothing(scaling, wrapper):
    cfg = Config(dict(model=dict(type='X'), launcher='none'))
    assert join_job(cfg, scaling) == []
    assert (cfg.get('model_wrapper_cfg') or {}).get('type') == wrapper
    assert not dist.is_initialized()


def _loopback_interfaces():
    """The interfaces with 127.0.0.1, read here from the system (psutil), not by the code
    under test."""
    import socket

    import psutil
    return {
        name
        for name, addrs in psutil.net_if_addrs().items()
        if any(a.family == socket.AF_INET and a.address == '127.0.0.1' for a in addrs)
    }


def test_starts_once_then_leaves_the_group_alone(monkeypatch):
    environ = dict(RANK='0', LOCAL_RANK='0', WORLD_SIZE='1', MASTER_ADDR='127.0.0.1',
                   MASTER_PORT=str(find_free_port()))
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    assert not dist.is_initialized()
    try:
        notes = ensure_process_group('pytorch', dict(timeout=60), read_dist_env(environ))
        assert notes[0] == 'process group: gloo' and dist.is_initialized()
        # all ranks on this host: gloo is pinned to the loopback interface (where one is found)
        assert os.environ.get('GLOO_SOCKET_IFNAME') in _loopback_interfaces()
        assert dist.get_world_size() == 1 and dist.get_backend() == 'gloo'
        # a second entry point (DDPRunner after dist_train.py) finds it and does nothing
        assert ensure_process_group('pytorch', dict(backend='nccl')) == []
        assert dist.get_backend() == 'gloo'
        # a runner joining after it: its wrapper is chosen, the group left as it is
        cfg = Config(dict(model=dict(type='X'), launcher='pytorch'))
        assert join_job(cfg) == [] and dist.get_backend() == 'gloo'
        assert cfg.model_wrapper_cfg.type == 'MMDistributedDataParallel'
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.fixture(autouse=True)
def _no_group_or_variable_left():
    """Starting a group sets variables for the rank's later processes (GLOO_SOCKET_IFNAME on a
    loopback job): restored here, or every later subprocess of this pytest process gets them."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
    assert not dist.is_initialized()


@pytest.mark.parametrize('requested, cuda, backend, warns', [(None, True, 'nccl', False),
                                                             (None, False, 'gloo', False),
                                                             ('nccl', False, 'gloo', True),
                                                             ('nccl', True, 'nccl', False),
                                                             ('gloo', True, 'gloo', False)])
def test_choose_backend(requested, cuda, backend, warns):
    got, warning = choose_backend(requested, cuda)
    assert got == backend and bool(warning) == warns
