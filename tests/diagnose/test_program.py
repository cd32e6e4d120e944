"""diagnose/program: the diagnosis's command line finds a failed run's work dir from the training
arguments as the training entry does, and says when the work dir is missing."""

import pytest

from mmddp_ext.diagnose.program import main, work_dir_from_train_args
from mmddp_ext.entry.cli import parse_args
from mmddp_ext.utils.config import default_work_dir, load_config

from conftest import DEMO_CONFIG


@pytest.mark.parametrize(
    'extra',
    [
        [],  # the config's own work_dir, else ./work_dirs/<config name>
        ['--work-dir', 'runs/a'],
        ['--launcher', 'pytorch', '--resume', '--cfg-options', 'work_dir=runs/b'],
        ['--cfg_options', 'train_cfg.max_epochs=2', 'work_dir=runs/c', '--amp'],
        ['--auto-scale-lr', '--work_dir', 'runs/d', '--unsafe-load'],
    ])
def test_the_work_dir_is_the_training_entrys(extra):
    argv = [DEMO_CONFIG] + extra
    args = parse_args(argv)
    trained_in = default_work_dir(args, load_config(args.config, args.cfg_options))
    assert work_dir_from_train_args(argv) == trained_in


def test_a_missing_work_dir_is_exit_2_with_the_reason(tmp_path, capsys):
    assert main([str(tmp_path / 'nowhere')]) == 2
    assert 'does not exist' in capsys.readouterr().err
