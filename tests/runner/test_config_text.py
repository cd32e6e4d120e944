"""TextOnceConfig: MMEngine's text, formatted once per content; DDPRunner holds one, and a
run's five asks (log, dump, visualizer, RuntimeInfoHook, checkpoint meta) format once.

In-process: yapf's ``FormatCode`` as MMEngine's config module calls it is counted (wrapped,
not replaced)."""
import copy
import os.path as osp
from unittest import mock

import mmengine.config.config as mmengine_config
import pytest
from mmengine.config import Config
from mmengine.testing import RunnerTestCase

from mmddp_ext.runner.config_text import TextOnceConfig
from mmddp_ext.runner.ddp_runner import DDPRunner

from conftest import DEMO_CONFIG


def _counting_format_code():
    return mock.patch.object(mmengine_config, 'FormatCode', wraps=mmengine_config.FormatCode)


def _rtmpose() -> str:
    import mmpose
    return osp.join(
        osp.dirname(mmpose.__file__), '.mim', 'configs', 'body_2d_keypoint', 'rtmpose', 'coco',
        'rtmpose-m_8xb256-420e_coco-256x192.py')


RETINANET = osp.join(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))), 'configs', 'examples', 'mmdet',
    'retinanet_r18_fpn_1xb4-12e_demo-det-128.py')


@pytest.mark.parametrize('config', ['demo', 'rtmpose', 'retinanet'])
def test_the_copy_is_the_configs_own(config):
    """Content, text, file name and text as MMEngine formats it, for real recipes."""
    plain = Config.fromfile(dict(demo=DEMO_CONFIG, retinanet=RETINANET).get(config) or _rtmpose())
    kept = TextOnceConfig.copy_of(plain)
    assert kept.to_dict() == plain.to_dict() and kept.filename == plain.filename
    assert kept.text == plain.text and kept.pretty_text == plain.pretty_text


def test_text_is_mmengine_s_and_formatted_once_per_content():
    plain = Config.fromfile(DEMO_CONFIG)
    kept = TextOnceConfig.copy_of(plain)
    with _counting_format_code() as fmt:
        texts = [kept.pretty_text for _ in range(4)]
        assert fmt.call_count == 1
        assert texts == [plain.pretty_text] * 4  # MMEngine's own formatting (a 2nd call)
        assert fmt.call_count == 2
        kept.train_cfg.max_epochs = 7  # a change: formatted again, and right
        assert 'max_epochs=7' in kept.pretty_text and fmt.call_count == 3
        plain.train_cfg.max_epochs = 7
        assert kept.pretty_text == plain.pretty_text


def test_copies_keep_the_class_and_are_independent(tmp_path):
    kept = TextOnceConfig.copy_of(dict(a=1, b=dict(c=[1, 2])))
    kept.pretty_text
    other = copy.deepcopy(kept)
    assert type(other) is TextOnceConfig and type(copy.copy(kept)) is TextOnceConfig
    other.b.c.append(3)
    assert kept.b.c == [1, 2]
    assert other.pretty_text == Config(dict(a=1, b=dict(c=[1, 2, 3]))).pretty_text
    assert kept.pretty_text == Config(dict(a=1, b=dict(c=[1, 2]))).pretty_text
    path = str(tmp_path / 'dumped.py')
    kept.dump(path)
    assert Config.fromfile(path).to_dict() == dict(a=1, b=dict(c=[1, 2]))


class TestDDPRunnerFormatsOnce(RunnerTestCase):
    """MMEngine's toy runner as DDPRunner, trained one epoch with a checkpoint."""

    def test_a_run_formats_its_config_once(self):
        cfg = copy.deepcopy(self.epoch_based_cfg)
        cfg.runner_type = 'DDPRunner'
        cfg.train_cfg.max_epochs = 1
        cfg.experiment_name = self.experiment_name
        with _counting_format_code() as fmt:
            runner = DDPRunner.from_cfg(cfg)
            runner.train()
        assert isinstance(runner.cfg, TextOnceConfig)
        # the dumped config and the checkpoint's meta hold the text: asked for, formatted once
        assert osp.isfile(
            osp.join(runner.work_dir,
                     osp.basename(runner.cfg.filename or '') or f'{runner.timestamp}.py'))
        assert fmt.call_count == 1
