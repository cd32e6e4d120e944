from .config import load_config, register_config_scope, resolve_config_path

__all__ = ['load_config', 'register_config_scope', 'resolve_config_path']
