"""``runner_type`` from every entry point that builds a Runner from a config.

MMEngine's ``Runner.from_cfg(cfg)`` builds a stock ``Runner`` whatever the config's
``runner_type`` says, so under MMPose's ``tools/train.py`` (which calls it) a config asking for
:class:`~mmddp_ext.runner.DDPRunner` silently got none of it. :func:`honour_runner_type`,
called once when ``mmddp_ext`` is imported (``custom_imports`` does that while the config is
read), makes it build ``runner_type``. docs/launching.md, 'Entry points you already have'.
"""
from typing import Any

from mmengine.runner import Runner

from .ddp_runner import applies_plan, runner_class

_PATCHED = '_mmddp_ext_honours_runner_type'


def _registered_subclass(runner_type: Any) -> Any:
    """The Runner subclass that ``runner_type`` names, or None (unknown, or ``Runner``)."""
    target = runner_class(runner_type)
    if target is not None and issubclass(target, Runner) and target is not Runner:
        return target
    return None


def honour_runner_type() -> None:
    """Make ``Runner.from_cfg`` build the config's ``runner_type``; MMEngine is extended at
    this one point. Idempotent.

    * ``Runner.from_cfg(cfg)``, called on ``Runner`` itself, builds ``cfg.runner_type`` when
      that names a registered subclass of ``Runner`` (``DDPRunner`` or any other), by that
      class's own ``from_cfg``. Subclasses' ``from_cfg``, ``RUNNERS.build`` and a config
      without ``runner_type`` (or with ``'Runner'``) behave exactly as before.
    * A stock ``Runner`` still constructed from a config whose ``runner_type`` plans
      (``Runner(**cfg)`` directly) logs one warning on every rank: the plan and our hooks are
      off.
    """
    if getattr(Runner, _PATCHED, False):
        return
    stock_from_cfg = Runner.from_cfg.__func__
    stock_init = Runner.__init__

    def from_cfg(cls, cfg):
        target = _registered_subclass(cfg.get('runner_type')) if cls is Runner else None
        if target is not None:
            return target.from_cfg(cfg)
        return stock_from_cfg(cls, cfg)

    def __init__(self, *args, **kwargs):
        stock_init(self, *args, **kwargs)
        if type(self) is Runner:
            asked = (getattr(self, 'cfg', None) or {}).get('runner_type')
            if applies_plan(asked):
                self.logger.warning(
                    f'[mmddp_ext] this config asks for runner_type={asked!r}, but a stock '
                    'mmengine Runner was built (Runner(...) directly): no scaling plan, no '
                    'ScalingHook/RankMemoryHook. Build it with Runner.from_cfg(cfg) or '
                    'RUNNERS.build(cfg)')

    from_cfg.__doc__ = stock_from_cfg.__doc__
    __init__.__doc__ = stock_init.__doc__
    Runner.from_cfg = classmethod(from_cfg)
    Runner.__init__ = __init__
    setattr(Runner, _PATCHED, True)
