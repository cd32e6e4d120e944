"""``mmddp_ext::`` config paths resolve however the package was installed: a PEP 660 editable
install (what ``pip install -e .`` makes with modern pip and setuptools, whose distribution
location holds no ``mmddp_ext`` folder) and a regular one (a wheel).

Each case installs a copy of the sources into a new virtual environment that sees the stack
(torch, MMEngine) through a path entry but not this checkout, then parses a config that
inherits ``mmddp_ext::_base_/ddp_runtime.py`` there, in a process of its own."""
import os
import os.path as osp
import shutil
import subprocess
import sys
import sysconfig

import pytest

from conftest import ROOT

SOURCES = ('setup.py', 'README.md', 'model-index.yml', 'requirements', 'configs', 'mmddp_ext',
           'mmddp_launch')

CHECK = """
import os.path as osp, sys
import mmddp_ext
from mmengine.config import Config
from mmddp_ext.utils.config import resolve_config_path
here = osp.dirname(osp.abspath(mmddp_ext.__file__))
assert here.startswith(sys.argv[1]), (here, sys.argv[1])
import mmddp_launch  # the launch side, the distribution's second package, installed beside it
assert osp.dirname(osp.abspath(mmddp_launch.__file__)).startswith(sys.argv[1])
path = resolve_config_path('mmddp_ext::_base_/ddp_runtime.py')
assert path.startswith(here), (path, here)
open('child.py', 'w').write("_base_ = ['mmddp_ext::_base_/ddp_runtime.py']\\n")
cfg = Config.fromfile('child.py')
print('resolved', path, cfg.runner_type)
"""


def _venv(tmp_path) -> str:
    """A new virtual environment whose interpreter finds the stack's packages (one path entry,
    so the stack's own ``.pth`` files, which point at this checkout, are not run)."""
    env_dir = str(tmp_path / 'venv')
    subprocess.run([sys.executable, '-m', 'venv', env_dir], check=True, timeout=300)
    py = osp.join(env_dir, 'bin', 'python')
    with open(osp.join(_purelib(py), 'stack.pth'), 'w') as f:
        f.write(sysconfig.get_paths()['purelib'] + '\n')
    return py


def _purelib(py: str) -> str:
    """The site-packages folder of interpreter ``py``."""
    return subprocess.run([py, '-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'],
                          check=True, text=True, stdout=subprocess.PIPE).stdout.strip()


@pytest.mark.slow
@pytest.mark.parametrize('editable', [True, False], ids=['pep660-editable', 'wheel'])
def test_base_path_resolves_after_install(tmp_path, editable):
    src = tmp_path / 'src'
    src.mkdir()
    for name in SOURCES:
        if osp.isdir(osp.join(ROOT, name)):
            shutil.copytree(osp.join(ROOT, name), str(src / name), symlinks=True)
        else:
            shutil.copy(osp.join(ROOT, name), str(src / name))
    shutil.rmtree(src / 'mmddp_ext' / '.mim', ignore_errors=True)
    py = _venv(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH', 'VIRTUAL_ENV')}
    pip = [
        py, '-m', 'pip', 'install', '--no-deps', '--no-build-isolation', '--no-index', '-q',
        '--disable-pip-version-check'
    ]
    # --use-pep517: the PEP 660 editable install whatever this pip's default for setup.py projects
    pip += ['--use-pep517', '-e', str(src)] if editable else [str(src)]
    got = subprocess.run(pip, env=env, cwd=str(tmp_path), text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, timeout=600)
    assert got.returncode == 0, got.stdout[-3000:]
    installed = str(src) if editable else _purelib(py)
    got = subprocess.run([py, '-c', CHECK, installed], env=env, cwd=str(tmp_path), text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    assert got.returncode == 0, got.stdout[-3000:]
    assert 'resolved ' + installed in got.stdout and 'DDPRunner' in got.stdout, got.stdout
