"""The `mmddp_ext::` config scope, pkg::path arguments, and registration at import."""
import os.path as osp

import pytest
from mmengine.config import Config
from mmengine.config.utils import MODULE2PACKAGE

import mmddp_ext
from mmddp_ext.utils.config import resolve_config_path

POSE_CFG = 'mmpose::body_2d_keypoint/topdown_heatmap/coco/td-hm_res50_8xb64-210e_coco-256x192.py'


def test_import_registers_scope():
    # MMEngine asks for a module whose folder is the package's, wherever it was installed
    assert MODULE2PACKAGE['mmddp_ext'].split('.')[0] == 'mmddp_ext'
    assert mmddp_ext.__version__


def test_base_config_resolves_through_package_scope(tmp_path):
    cfg_file = tmp_path / 'child.py'
    cfg_file.write_text(f"_base_ = ['{POSE_CFG}', 'mmddp_ext::_base_/ddp_runtime.py']\n"
                        "train_cfg = dict(max_epochs=3)\n")
    cfg = Config.fromfile(str(cfg_file))
    assert cfg.custom_imports == dict(imports=['mmddp_ext'], allow_failed_imports=False)
    assert cfg.model.backbone.depth == 50  # from the mmpose base
    assert cfg.train_cfg.max_epochs == 3  # the child's override


def test_relative_base_path_alternative(tmp_path):
    base = resolve_config_path('mmddp_ext::_base_/ddp_runtime.py')
    cfg_file = tmp_path / 'child.py'
    cfg_file.write_text(f"_base_ = [{osp.relpath(base, tmp_path)!r}]\n")
    assert Config.fromfile(str(cfg_file)).custom_imports.imports == ['mmddp_ext']


def test_resolve_pkg_path_and_plain_path():
    path = resolve_config_path(POSE_CFG)
    assert osp.isfile(path) and path.endswith('td-hm_res50_8xb64-210e_coco-256x192.py')
    assert resolve_config_path(path) == path


@pytest.mark.parametrize('bad, words', [
    ('no/such/config.py', ['no/such/config.py', 'does not exist']),
    ('mmpose::no_such/config.py', ['mmpose::no_such/config.py', 'not found']),
])
def test_missing_config_names_the_path(bad, words):
    with pytest.raises(FileNotFoundError) as e:
        resolve_config_path(bad)
    for w in words:
        assert w in str(e.value)
