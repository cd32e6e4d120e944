"""Packaging for mmddp_ext (OpenMMLab layout: configs ship inside the package as .mim/configs)."""
import os
import os.path as osp
import shutil

from setuptools import find_packages, setup

ROOT = osp.dirname(osp.abspath(__file__))


def read_requirements(name):
    """Return the requirement lines of requirements/<name>, without comments."""
    with open(osp.join(ROOT, 'requirements', name)) as f:
        return [line.split('#')[0].strip() for line in f if line.split('#')[0].strip()]


def get_version():
    """Read __version__ from mmddp_ext/version.py without importing the package."""
    scope = {}
    with open(osp.join(ROOT, 'mmddp_ext', 'version.py')) as f:
        exec(f.read(), scope)
    return scope['__version__']


def add_mim_extension():
    """Expose configs/ and model-index.yml under mmddp_ext/.mim, as OpenMMLab packages do.

    MMEngine resolves ``mmddp_ext::path`` to ``mmddp_ext/.mim/configs/path`` (and reads
    ``.mim/model-index.yml`` first). Editable installs get symlinks, so edits to configs/ are
    seen at once; wheels and sdists get copies.
    """
    import sys
    link = bool({'develop', 'editable_wheel'} & set(sys.argv))
    mim = osp.join(ROOT, 'mmddp_ext', '.mim')
    os.makedirs(mim, exist_ok=True)
    for name in ('configs', 'model-index.yml'):
        src, dst = osp.join(ROOT, name), osp.join(mim, name)
        if osp.islink(dst) or osp.isfile(dst):
            os.remove(dst)
        elif osp.isdir(dst):
            shutil.rmtree(dst)
        if link:
            os.symlink(osp.relpath(src, mim), dst)
        elif osp.isdir(src):
            shutil.copytree(src, dst)
        else:
            shutil.copyfile(src, dst)


if __name__ == '__main__':
    add_mim_extension()
    setup(
        name='mmddp_ext',
        version=get_version(),
        description='Correct, understandable multi-GPU and multi-node training for MMEngine '
        'projects (MMPose, MMDetection)',
        long_description=open(osp.join(ROOT, 'README.md')).read(),
        long_description_content_type='text/markdown',
        packages=find_packages(exclude=('tests', 'tests.*', 'tools', 'configs', 'bench')),
        include_package_data=True,
        package_data={'mmddp_ext': ['.mim/model-index.yml', '.mim/configs/**/*.py']},
        python_requires='>=3.8',
        install_requires=read_requirements('runtime.txt'),
        extras_require={
            'tests': read_requirements('tests.txt'),
            'demo': read_requirements('demo.txt')
        },
        license='Apache License 2.0',
        zip_safe=False,
    )
