"""Our default hooks, each a ``default_hooks`` key of its own beside MMEngine's (README, "Use it
in your configs"): :data:`DEFAULT_HOOKS` and how a config's ``default_hooks`` and
``custom_hooks`` resolve them (:func:`our_default_hooks`), as :class:`~mmddp_ext.runner.DDPRunner`
registers them."""
import logging
from typing import Any, Optional

from ..utils.log import log_line

# Our default hooks, each a ``default_hooks`` key beside MMEngine's own (README, "Use it in your
# configs"): ``default_hooks.<key>=None`` removes one, a dict without ``type`` changes its
# arguments, a dict with ``type`` replaces it.
DEFAULT_HOOKS = dict(
    rank_agreement=dict(type='AgreementHook'),
    scaling_plan=dict(type='ScalingHook'),
    rank_memory=dict(type='RankMemoryHook', interval=50),
    finite_loss=dict(type='FiniteLossHook', action='stop'),
    hang_watchdog=dict(type='HangWatchdogHook'),
    preemption=dict(type='PreemptionHook'),
    # MMEngine's own: the ranks' BatchNorm statistics drift apart in training (DDP does not
    # sync buffers at every forward); averaged after each training epoch, so that every rank
    # validates with the same model. A config's own SyncBuffersHook in custom_hooks is the one.
    sync_buffers=dict(type='SyncBuffersHook'),
    # the ranks' mean training losses in the log (hooks/global_loss_hook.py)
    global_loss=dict(type='GlobalLossHook'),
    # before the first iteration: a node whose /dev/shm or memory cannot hold its loading
    node_limits=dict(type='NodeLimitsHook'),
)
MMENGINE_HOOKS = ('SyncBuffersHook', )  # listed in custom_hooks: expected, no warning


def hook_type_name(hook: Any) -> str:
    """The class name of a hook given as a config dict or an object."""
    kind = hook.get('type') if isinstance(hook, dict) else type(hook)
    return str(getattr(kind, '__name__', kind)).split('.')[-1]


def our_default_hooks(default_hooks: Optional[dict], custom_hooks: Optional[list],
                      warn: bool = False) -> dict:
    """``default_hooks`` with ours resolved (:data:`DEFAULT_HOOKS`): a key set to None is
    dropped, a dict without ``type`` is merged onto ours, a missing key gets ours, unless
    ``custom_hooks`` lists a hook of that type (then the user's is the one; a warning names
    the key it belongs under, with ``warn``). MMEngine's own keys are left as they are."""
    hooks = dict(default_hooks or {})
    listed = {hook_type_name(h) for h in custom_hooks or []}
    for key, ours in DEFAULT_HOOKS.items():
        given = key in hooks
        value = hooks.pop(key, ours)
        if value is None:
            continue
        if not given and ours['type'] in listed:
            if warn and ours['type'] not in MMENGINE_HOOKS:
                log_line(
                    f'custom_hooks lists {ours["type"]}, one of our default hooks: it is used '
                    f'instead of ours; default_hooks.{key}=dict(...) is where its arguments '
                    f'go (default_hooks.{key}=None removes it)', logging.WARNING, rank0_only=True)
            continue
        if isinstance(value, dict) and 'type' not in value:
            value = dict(ours, **value)
        hooks[key] = value
    return hooks
