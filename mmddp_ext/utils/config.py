"""Config helpers: the ``mmddp_ext::`` scope and ``pkg::path`` config arguments.

MMEngine resolves ``pkg::path`` (in ``_base_`` lists) only for packages in its hard-coded
``MODULE2PACKAGE`` table, and it parses ``_base_`` *before* ``custom_imports`` run. So
``_base_ = ['mmddp_ext::_base_/ddp_runtime.py']`` works whenever ``mmddp_ext`` was imported
before the config is parsed, which our tools guarantee. Other entry points (for example MMPose's
own ``tools/train.py``) can inherit our base config by a relative path instead.
"""
import argparse
import os.path as osp
from typing import Any, Optional

from mmengine.config import Config, DictAction
from mmengine.config.utils import (MODULE2PACKAGE, _get_external_cfg_base_path,
                                   _get_package_and_cfg_path)
from mmengine.utils import get_installed_path

from ..errors import ConfigFileNotFound

SCOPE = 'mmddp_ext'
# What MMEngine's ``get_installed_path`` is asked for when it resolves ``mmddp_ext::``: a module
# name that is no distribution's, so MMEngine takes the folder from ``importlib`` (the module's
# own file), which is right for every way of installing. The distribution's name would make it
# join the distribution's location and ``mmddp_ext``, a folder that a PEP 660 editable install
# (``pip install -e .`` with modern pip and setuptools) never creates.
SCOPE_MODULE = 'mmddp_ext.version'


def register_config_scope() -> None:
    """Add ``mmddp_ext`` to MMEngine's ``MODULE2PACKAGE`` so ``mmddp_ext::`` paths resolve to
    ``<package folder>/.mim/configs`` however the package was installed (editable, a wheel).

    Idempotent; this is the only thing importing ``mmddp_ext`` changes in MMEngine's config
    machinery.
    """
    MODULE2PACKAGE[SCOPE] = SCOPE_MODULE


def resolve_config_path(path: str) -> str:
    """Turn a config argument into a file path.

    Accepts a file path or ``pkg::relative/path.py`` for an installed OpenMMLab package
    (``mmpose::``, ``mmdet::``, ``mmddp_ext::``...), which ``Config.fromfile`` does not accept
    by itself.

    Raises:
        ConfigFileNotFound: naming the path and, for ``pkg::`` paths, where it was looked for.
    """
    if '::' not in path:
        if not osp.isfile(path):
            raise ConfigFileNotFound(f'config file {path!r} does not exist '
                                     f'(working directory: {osp.abspath(".")})')
        return path
    register_config_scope()
    scope = path.partition('::')[0]
    if scope not in MODULE2PACKAGE:
        raise ConfigFileNotFound(f'config {path!r}: unknown package {scope!r}; known: '
                                 f'{", ".join(sorted(MODULE2PACKAGE))}')
    package, rel = _get_package_and_cfg_path(path)
    try:
        return _get_external_cfg_base_path(get_installed_path(package), rel)
    except FileNotFoundError as e:
        raise ConfigFileNotFound(f'config {path!r} not found: {scope} has no .mim/configs/{rel} '
                                 f'(is {scope} installed?)') from e


def load_config(path: str, cfg_options: Optional[dict] = None) -> Config:
    """Load a config from a path or ``pkg::path`` and merge ``--cfg-options``."""
    cfg = Config.fromfile(resolve_config_path(path))
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    return cfg


def add_work_dir_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The flags of ``tools/dist_train.py`` that decide its work dir (the config, ``--work-dir``,
    ``--cfg-options``), for its parser and for the diagnosis, which finds a failed run's work
    dir from the same arguments (:func:`default_work_dir`). Returns ``parser``."""
    parser.add_argument('config', help='config file path, or pkg::path of an installed package')
    parser.add_argument('--work-dir', '--work_dir', help='where logs and checkpoints go')
    parser.add_argument('--cfg-options', '--cfg_options', nargs='+', action=DictAction,
                        help='override config keys, e.g. train_cfg.max_epochs=2')
    return parser


def default_work_dir(args: argparse.Namespace, cfg: Optional[Any] = None) -> str:
    """``--work-dir``, else the config's ``work_dir``, else ``./work_dirs/<config name>``
    (MMPose's rule)."""
    if args.work_dir:
        return args.work_dir
    if cfg is not None and cfg.get('work_dir'):
        return cfg.work_dir
    return osp.join('./work_dirs', osp.splitext(osp.basename(args.config.split('::')[-1]))[0])
