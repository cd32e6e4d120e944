"""The documented switches of ``tools/dist_train.py`` do what the README and the docs say:
``--amp``, ``--local-rank``, ``--unsafe-load`` (and ``unsafe_load = True`` in the config),
``--auto-scale-lr``, ``--resume``; in-process, through ``parse_args`` and ``build_config`` as
``mmddp_ext.entry.train.main`` calls them."""
import pytest
import torch

from mmddp_ext.checkpoint import UNSAFE_ENV, load_checkpoint_file
from mmddp_ext.entry.cli import parse_args
from mmddp_ext.entry.train import build_config

from conftest import DEMO_CONFIG


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """The switches write these variables; each test starts without them and leaves them as
    they were (set first, so that monkeypatch restores even a variable that was absent)."""
    for name in ('LOCAL_RANK', UNSAFE_ENV):
        monkeypatch.setenv(name, '')
        monkeypatch.delenv(name)


def _cfg(*argv):
    return build_config(parse_args([DEMO_CONFIG, *argv]))


def test_amp_switches_to_the_amp_wrapper_with_a_dynamic_loss_scale():
    assert _cfg().optim_wrapper.get('type', 'OptimWrapper') == 'OptimWrapper'
    cfg = _cfg('--amp')
    assert cfg.optim_wrapper.type == 'AmpOptimWrapper' and cfg.optim_wrapper.loss_scale == 'dynamic'
    assert cfg.optim_wrapper.optimizer.type == 'Adam'  # the rest as written
    # a loss scale the config chose is kept
    cfg = _cfg('--amp', '--cfg-options', 'optim_wrapper.loss_scale=512.0')
    assert cfg.optim_wrapper.loss_scale == 512.0


@pytest.mark.parametrize('flag', ['--local-rank', '--local_rank'])
def test_local_rank_is_accepted_and_the_environment_wins(flag, monkeypatch):
    import os
    parse_args([DEMO_CONFIG, f'{flag}=3'])
    assert os.environ['LOCAL_RANK'] == '3'  # torch.distributed.launch's way, without the variable
    monkeypatch.setenv('LOCAL_RANK', '1')
    parse_args([DEMO_CONFIG, flag, '2'])
    assert os.environ['LOCAL_RANK'] == '1'  # set by the launcher: it wins


class Legacy:
    """An object a legacy checkpoint pickles, which ``weights_only`` loading refuses."""


@pytest.mark.parametrize(
    'argv', [['--unsafe-load'], ['--unsafe_load'], ['--cfg-options', 'unsafe_load=True']],
    ids=['--unsafe-load', '--unsafe_load', 'unsafe_load in the config'])
def test_unsafe_load_lets_a_legacy_checkpoint_load(argv, tmp_path):
    path = str(tmp_path / 'legacy.pth')
    torch.save(dict(state_dict={'w': torch.ones(2)}, meta=Legacy()), path)
    with pytest.raises(RuntimeError, match='--unsafe-load'):
        load_checkpoint_file(path, map_location='cpu')  # refused without the switch
    _cfg()
    with pytest.raises(RuntimeError, match='--unsafe-load'):
        load_checkpoint_file(path, map_location='cpu')  # nor by a plain build
    _cfg(*argv)
    loaded = load_checkpoint_file(path, map_location='cpu')
    assert isinstance(loaded['meta'], Legacy) and loaded['state_dict']['w'].sum() == 2


def test_auto_scale_lr_and_resume_switches():
    cfg = _cfg('--auto-scale-lr')
    assert cfg.auto_scale_lr.enable is True
    cfg = _cfg('--resume')
    assert (cfg.resume, cfg.load_from) == (True, None)  # the latest in the work dir
    cfg = _cfg('--resume', 'some/epoch_3.pth')
    assert (cfg.resume, cfg.load_from) == (True, 'some/epoch_3.pth')
