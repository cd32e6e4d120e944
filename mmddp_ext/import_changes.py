"""Everything ``import mmddp_ext`` changes outside the package, in one place, each with its
reason. The package is imported into processes we do not own (MMPose's and MMDetection's own
``tools/train.py`` through ``custom_imports``, notebooks), so this list is kept as short as the
features need; ``tests/test_import_changes.py`` checks that importing changes nothing else in
MMEngine, the environment, the warning filters or the collector, and that a stock ``Runner``
trains the same with and without the import.

Registering our modules in MMEngine's registries (``@HOOKS.register_module()``, ...) is not
listed: it adds names, and changes nothing a config without them builds.
"""
from typing import Callable, NamedTuple, Tuple

from .checkpoint import register_safe_loader
from .runner.runner_type import honour_runner_type
from .utils.config import register_config_scope


class ImportChange(NamedTuple):
    """One change: what it touches, why it must happen at import, and the function doing it."""

    what: str
    why: str
    apply: Callable[[], None]


def _config_scope() -> None:
    register_config_scope()


def _safe_loader() -> None:
    register_safe_loader()


def _runner_type() -> None:
    honour_runner_type()


IMPORT_CHANGES: Tuple[ImportChange, ...] = (
    ImportChange(
        "mmengine.config's MODULE2PACKAGE gets 'mmddp_ext'",
        'config files name our base files as mmddp_ext::_base_/...; MMEngine resolves such a '
        'path only for a package in this table, and the config is read before any of our code '
        'runs otherwise', _config_scope),
    ImportChange(
        "MMEngine's CheckpointLoader: our loader for local paths (register_scheme(prefixes='', "
        'force=True))', 'on torch >= 2.6 MMEngine 0.10.7 loads with weights_only=True and '
        'fails on its own checkpoints (HistoryBuffer); ours allows exactly MMEngine\'s types, so '
        'a resume works under any entry point, and a legacy file needs an explicit opt-in '
        '(docs/checkpoints.md, "Safe to load")', _safe_loader),
    ImportChange(
        'Runner.from_cfg and Runner.__init__ (mmddp_ext.runner.runner_type)',
        "Runner.from_cfg builds a stock Runner whatever the config's runner_type says; MMPose's "
        "tools/train.py calls it, so a config asking for DDPRunner would silently get none of "
        'it. A config without runner_type (or with a stock one) builds exactly as before',
        _runner_type),
)


def apply_import_changes() -> None:
    """Make each listed change (idempotent; called once by ``mmddp_ext/__init__.py``)."""
    for change in IMPORT_CHANGES:
        change.apply()
