"""The layout rule of docs/development.md holds: in the order of its listing ("How the code is
laid out"), a module imports from its own folder or from a line below it, never from a line
above; and every folder and top-level module of the package is listed."""
import os
import os.path as osp
import re

from conftest import ROOT

PACKAGE = osp.join(ROOT, 'mmddp_ext')


def _listed_order():
    text = open(osp.join(ROOT, 'docs', 'development.md')).read()
    block = text.split('## How the code is laid out', 1)[1].split('```', 2)[1]
    order = []
    for line in block.splitlines():
        m = re.match(r'mmddp_ext/(\S+?)(?:/|\.py)?(?:,\s*(\w+)\.py)?\s', line)
        if m:
            order += [m.group(1)] + ([m.group(2)] if m.group(2) else [])
    return order


def _imports(path, package):
    """The ``mmddp_ext`` subpackage or module each relative import of ``path`` names."""
    out = []
    for m in re.finditer(r'^\s*from (\.+)([\w.]*) import (.+)$', open(path).read(), re.M):
        dots, name, names = m.groups()
        base = package[:len(package) - (len(dots) - 1)]
        target = base + (name.split('.') if name else [])
        if len(target) == 1:  # from mmddp_ext import x / from . import x at the root
            target = target + [names.split(',')[0].split()[0]]
        out.append(target[1])
    return out


def test_imports_go_downward_in_the_readme_order():
    order = _listed_order()
    assert order[:2] == ['entry', 'demo'] and 'gpu' in order, order
    wrong, unlisted = [], set()
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            path = osp.join(folder, name)
            rel = osp.relpath(path, PACKAGE)
            if not name.endswith('.py'):
                continue
            top = rel.split(os.sep)[0].replace('.py', '')
            if top in ('__init__', 'version', 'registry', 'import_changes'):
                continue  # the package's own face: registration, version, MMEngine's lookup,
                # what importing it changes
            if top not in order:
                unlisted.add(top)
                continue
            package = ['mmddp_ext'] + rel.split(os.sep)[:-1]
            for target in _imports(path, package):
                if target in order and order.index(target) < order.index(top):
                    wrong.append(f'{rel} imports {target} (listed above {top})')
    assert not unlisted, f'not in the layout of docs/development.md: {sorted(unlisted)}'
    assert not wrong, '\n'.join(wrong)
