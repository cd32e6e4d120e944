"""Every private MMEngine name mmddp_ext uses (``mmddp_ext.utils.mmengine_private``) exists in the
installed MMEngine, on the class or on a real instance; and the package uses no other one."""
import importlib
import os
import os.path as osp
import re

import pytest
import torch

from mmddp_ext.utils.mmengine_private import PRIVATE_NAMES

PACKAGE = osp.join(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))), 'mmddp_ext')


def _owner(path: str) -> type:
    module, cls = path.split(':')
    return getattr(importlib.import_module(module), cls)


def _instance(cls: type, work_dir: str):
    """A real instance of the owner, built as MMEngine builds it."""
    from mmengine.logging import HistoryBuffer
    from mmengine.optim import OptimWrapper
    from mmengine.runner.loops import (EpochBasedTrainLoop, IterBasedTrainLoop,
                                       _InfiniteDataloaderIterator)
    if cls is _InfiniteDataloaderIterator:
        return cls([0, 1])
    if cls is OptimWrapper:
        return OptimWrapper(torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1))
    if cls is HistoryBuffer:
        return HistoryBuffer()
    from mmengine.runner import Runner
    from mmengine.testing import RunnerTestCase
    case = RunnerTestCase()
    case.setUp()
    try:
        cfg = case.iter_based_cfg if cls is IterBasedTrainLoop else case.epoch_based_cfg
        cfg.work_dir, cfg.experiment_name = work_dir, osp.basename(work_dir)
        runner = Runner.from_cfg(cfg)
        return runner.train_loop if cls in (EpochBasedTrainLoop, IterBasedTrainLoop) else runner
    finally:
        case.tearDown()


@pytest.mark.parametrize('entry', PRIVATE_NAMES, ids=lambda e: f'{e.owner}.{e.name}')
def test_each_private_name_exists_in_the_installed_mmengine(entry, tmp_path):
    cls = _owner(entry.owner)
    where = cls if entry.kind == 'class' else _instance(cls, str(tmp_path))
    assert hasattr(where, entry.name), (
        f'MMEngine no longer has {entry.owner}.{entry.name}, which {entry.used_in} uses '
        f'({entry.why}): adapt that module')
    assert osp.isfile(osp.join(PACKAGE, entry.used_in))


# the MMEngine classes mmddp_ext subclasses or reaches into, by their source files
MMENGINE_SOURCES = ('runner/runner.py', 'runner/loops.py', 'runner/base_loop.py', 'hooks/hook.py',
                    'hooks/checkpoint_hook.py', 'optim/optimizer/optimizer_wrapper.py',
                    'model/base_model/base_model.py', 'model/wrappers/distributed.py',
                    'logging/history_buffer.py', 'dataset/sampler.py')
PRIVATE = r'_[a-z]\w*'
# where a module defines a private name of its own: assigned on self, a def, a class attribute
DEFINES = (rf'self\.({PRIVATE})\s*(?::[^=\n]+)?=(?!=)|def ({PRIVATE})\b|'
           rf'^\s+({PRIVATE})\s*(?::[^=\n]+)?=(?!=)')


def _mmengine_private_names() -> set:
    import mmengine
    root = osp.dirname(mmengine.__file__)
    names = set()
    for rel in MMENGINE_SOURCES:
        text = open(osp.join(root, rel)).read()
        names |= set(re.findall(rf'(?:self\.|def |^\s+)({PRIVATE})\b', text, re.M))
    return names


def _overridden_private_names() -> dict:
    """{name: {module}} of the private methods and attributes of MMEngine classes that a class
    of the package overrides (itself or through a mixin in its MRO)."""
    import pkgutil

    import mmddp_ext
    found = {}
    for info in pkgutil.walk_packages(mmddp_ext.__path__, 'mmddp_ext.'):
        if info.name.endswith('__main__'):
            continue
        for cls in vars(importlib.import_module(info.name)).values():
            if not isinstance(cls, type):
                continue
            theirs = [c for c in cls.__mro__ if c.__module__.startswith('mmengine.')]
            for ours in cls.__mro__:
                if not ours.__module__.startswith('mmddp_ext.'):
                    continue
                for name in set(vars(ours)) - {'_abc_impl'}:  # set by ABCMeta on every class
                    if re.fullmatch(PRIVATE, name) and any(name in vars(c) for c in theirs):
                        found.setdefault(name, set()).add(ours.__module__)
    return found


def test_no_other_private_mmengine_name_is_used():
    """A private name of MMEngine's classes (an attribute or method its source defines) that
    the package uses, on ``self`` in a subclass or on any object, is listed, unless the package
    defines that name itself."""
    sources = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith('.py'):
                path = osp.join(folder, name)
                sources[osp.relpath(path, PACKAGE)] = open(path).read()
    ours = {
        n
        for text in sources.values()
        for groups in re.findall(DEFINES, text, re.M)
        for n in groups if n
    }
    overridden = _overridden_private_names()
    listed = {e.name for e in PRIVATE_NAMES}
    # a listed name stays MMEngine's where a subclass of ours sets it too (a re-implemented
    # __init__ sets the loop's _iter)
    theirs = _mmengine_private_names() - (ours - set(overridden) - listed)
    assert {'_save_checkpoint_with_step', '_inner_count', '_has_loaded'} <= theirs  # it reads
    used = {}
    for rel, text in sources.items():
        for attr in re.findall(rf"\w\.({PRIVATE})\b|getattr\(\w+, '({PRIVATE})'", text):
            attr = attr[0] or attr[1]
            if attr in theirs:
                used.setdefault(attr, set()).add(rel)
        for name in re.findall(r'^from mmengine[\w.]* import (_\w+)', text, re.M):
            used.setdefault(name, set()).add(rel)  # a private class, imported by name
    for name, modules in overridden.items():
        used.setdefault(name, set()).update(modules)
    assert '_save_checkpoint_with_step' in used  # overridden by FiniteCheckpointHook's mixin
    assert set(used) <= listed, f'private MMEngine names used but not listed: ' \
        f'{ {k: sorted(v) for k, v in used.items() if k not in listed} }'
    assert listed - {'from_cfg'} <= set(used), 'listed but no longer used: drop them from the list'
