"""utils/config: config arguments as paths or ``pkg::path``, each mistake named with where it
was looked for, and MMPose's work-dir rule."""
import argparse
import os.path as osp
import re

import pytest
from mmengine.config import Config

from mmddp_ext.errors import ConfigFileNotFound
from mmddp_ext.utils.config import default_work_dir, load_config, resolve_config_path

from conftest import DEMO_CONFIG


def test_a_package_path_resolves_to_the_installed_config():
    path = resolve_config_path('mmpose::body_2d_keypoint/topdown_heatmap/coco/'
                               'td-hm_res50_8xb64-210e_coco-256x192.py')
    assert osp.isfile(path) and path.endswith('td-hm_res50_8xb64-210e_coco-256x192.py')


@pytest.mark.parametrize('path, words', [
    ('nope/missing.py', "config file 'nope/missing.py' does not exist (working directory"),
    ('nopkg::a.py', "unknown package 'nopkg'; known:"),
    ('mmpose::no/such.py', 'mmpose has no .mim/configs/no/such.py'),
])
def test_each_missing_config_is_named_with_where_it_was_looked_for(path, words):
    with pytest.raises(ConfigFileNotFound, match=re.escape(words)):
        resolve_config_path(path)


def test_cfg_options_are_merged():
    cfg = load_config(DEMO_CONFIG, {'train_cfg.max_epochs': 3})
    assert cfg.train_cfg.max_epochs == 3


@pytest.mark.parametrize('flag, cfg, expected', [
    ('runs/a', dict(work_dir='runs/cfg'), 'runs/a'),
    (None, dict(work_dir='runs/cfg'), 'runs/cfg'),
    (None, {}, osp.join('./work_dirs', 'td-hm_res18_1xb32-30e_demo-64x64')),
    (None, None, osp.join('./work_dirs', 'td-hm_res18_1xb32-30e_demo-64x64')),
])
def test_the_work_dir_rule(flag, cfg, expected):
    args = argparse.Namespace(work_dir=flag, config='mmddp_ext::demo/td-hm_res18_1xb32-30e_demo'
                              '-64x64.py')
    assert default_work_dir(args, None if cfg is None else Config(cfg)) == expected
