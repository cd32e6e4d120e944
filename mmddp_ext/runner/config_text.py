"""``TextOnceConfig``: a Config whose ``pretty_text`` is formatted once per content.

MMEngine's Runner asks for ``pretty_text`` several times a run (the logged environment, the
dumped config, the visualizer, ``RuntimeInfoHook``, every checkpoint's meta), and each time
formats the whole config anew with yapf. ``DDPRunner`` holds its config as a ``TextOnceConfig``:
the text is kept with the content it was made from and made again only when that changed. The
text is MMEngine's own, character for character.
"""
import copy
from typing import Any

from mmengine.config import Config


class TextOnceConfig(Config):
    """MMEngine's Config; ``pretty_text`` (and so ``dump``) formats once per content."""

    @classmethod
    def copy_of(cls, cfg: Any) -> 'TextOnceConfig':
        """A deep copy of ``cfg`` (a Config or a dict) as a ``TextOnceConfig``, through
        ``Config``'s public constructor: its content, source text, file name and environment
        variables."""
        if not isinstance(cfg, Config):
            return cls(copy.deepcopy(dict(cfg)))
        return cls(
            copy.deepcopy(cfg.to_dict()), cfg_text=cfg.text, filename=cfg.filename,
            env_variables=copy.deepcopy(cfg.env_variables))

    @property
    def pretty_text(self) -> str:
        content = repr(self.to_dict())
        kept = vars(self).get('_kept_text')
        if kept is None or kept[0] != content:
            kept = (content, Config.pretty_text.fget(self))
            object.__setattr__(self, '_kept_text', kept)  # Config routes setattr to its dict
        return kept[1]
