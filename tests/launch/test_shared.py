"""The launch side (:mod:`mmddp_launch`) stands alone, and what the front, the scripts and the
ranks agree on is one definition (:mod:`mmddp_launch.shared`): the shell scripts' copies of
the stop exit code and the stop signals are read from their files and held equal to it."""
import os.path as osp
import re
import signal
import subprocess

from mmddp_ext.hooks.preemption_hook import PreemptionHook
from mmddp_ext.launcher import torchrun_front
from mmddp_launch.shared import STOP_SIGNALS, STOPPED_EXIT_CODE

from conftest import PYTHON, ROOT

_ALONE = r'''
import pkgutil, sys, mmddp_launch
for info in pkgutil.iter_modules(mmddp_launch.__path__):
    __import__(f'mmddp_launch.{info.name}')
__import__('runpy').run_path(sys.argv[1])  # the front's imports, as a script (not its main)
print(sorted(m.split('.')[0] for m in sys.modules if m.split('.')[0] in
             ('torch', 'mmengine', 'mmcv', 'mmddp_ext', 'numpy')))
'''


def _text(*path: str) -> str:
    with open(osp.join(ROOT, *path)) as f:
        return f.read()


def test_the_launch_side_and_the_front_import_no_training_stack():
    front = osp.join(ROOT, 'mmddp_ext', 'launcher', 'torchrun_front.py')
    proc = subprocess.run([PYTHON, '-c', _ALONE, front], capture_output=True, text=True, cwd='/')
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == '[]', proc.stdout


def test_the_stop_exit_code_is_one_number_everywhere():
    entry = _text('tools', 'dist_train.py')
    assert not re.findall(r'\b75\b', entry)  # it names mmddp_launch's
    assert 'sys.exit(STOPPED_EXIT_CODE)' in entry
    script = _text('tools', 'dist_train.sh')
    assert re.findall(r'"\$rc" != (\d+)', script) == ['0', '2', str(STOPPED_EXIT_CODE)]
    assert torchrun_front.NOTHING_STARTED == 2


def test_the_stop_signals_are_the_same_set():
    hook = set(PreemptionHook().signals)  # {number: name} of its default signals
    assert hook == set(STOP_SIGNALS)
    forwarded = set(
        re.findall(r"trap '[^']*' (TERM|USR1)$", _text('tools', 'lib', 'forward_signals.sh'), re.M))
    assert {getattr(signal, f'SIG{name}') for name in forwarded} == set(STOP_SIGNALS)
