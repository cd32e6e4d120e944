"""Registries of the ``mmddp_ext`` scope.

mmddp_ext registers its runner and hooks in MMEngine's *root* registries, so they are found
from any scope (``mmpose``, ``mmdet``, ...) through the parent chain. This module exists because
MMEngine imports ``<scope>.registry`` when it builds a module whose config came from a
``mmddp_ext::`` base file (``_scope_='mmddp_ext'``); it finds no child registry named
``mmddp_ext`` and falls back to the root registry, which is where our modules are.
"""
from mmengine.registry import HOOKS, RUNNERS

__all__ = ['HOOKS', 'RUNNERS']
