"""The package talks to torch.cuda and NVML only through :mod:`mmddp_ext.gpu`."""
import ast
import os
import os.path as osp

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
SEAM = osp.join('mmddp_ext', 'gpu', 'cuda.py')
# tools/dist_train.py pins the device before it imports the package (which imports MMEngine)
ALLOWED = {SEAM, osp.join('tools', 'dist_train.py')}


def gpu_calls(tree: ast.AST):
    """``(line, what)`` of every import of torch.cuda/pynvml and every ``torch.cuda`` use."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split('.')[0] == 'pynvml' or alias.name.startswith('torch.cuda'):
                    yield node.lineno, f'import {alias.name}'
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ''
            names = {a.name for a in node.names}
            from_torch = module == 'torch' and 'cuda' in names
            if module.startswith(('pynvml', 'torch.cuda')) or from_torch:
                yield node.lineno, f'from {module} import ...'
        elif (isinstance(node, ast.Attribute) and node.attr == 'cuda'
              and isinstance(node.value, ast.Name) and node.value.id == 'torch'):
            yield node.lineno, 'torch.cuda'


def python_files(*folders):
    for folder in folders:
        for dirpath, _, names in os.walk(osp.join(ROOT, folder)):
            for name in names:
                if name.endswith('.py'):
                    yield osp.relpath(osp.join(dirpath, name), ROOT)


def test_only_the_seam_calls_torch_cuda_or_nvml():
    found = []
    for path in python_files('mmddp_ext', 'tools'):
        if path in ALLOWED:
            continue
        with open(osp.join(ROOT, path)) as f:
            tree = ast.parse(f.read(), path)
        found += [f'{path}:{line}: {what}' for line, what in gpu_calls(tree)]
    assert not found, 'use mmddp_ext.gpu.gpus() instead:\n' + '\n'.join(found)


def test_the_check_finds_each_way_of_reaching_cuda():
    """Positive control: each spelling is found, docstrings and other attributes are not."""
    source = '''
"""torch.cuda.set_device in a docstring is fine."""
import torch
import torch.cuda
import pynvml
from torch import cuda
from torch.cuda import memory_allocated
x = torch.cuda.memory_allocated()
y = torch.device('cuda')
'''
    found = sorted(line for line, _ in gpu_calls(ast.parse(source)))
    assert found == [4, 5, 6, 7, 8]


def test_the_seam_itself_is_seen_by_the_check():
    with open(osp.join(ROOT, SEAM)) as f:
        assert list(gpu_calls(ast.parse(f.read())))
