"""What the torchrun front, the scripts and the ranks must agree on, where each keeps its own copy
(the front and ``tools/dist_train.py`` run before the package can be imported; the shell scripts
are shell): the stop exit code, the stop signals and the environment markers between them. Each
copy is read from its file and held equal to the package's."""
import os.path as osp
import re
import signal

from mmddp_ext.dataloader.workers import STOP_SIGNALS as WORKER_STOP_SIGNALS
from mmddp_ext.hooks.preemption_hook import STOPPED_EXIT_CODE, PreemptionHook
from mmddp_ext.launcher import torchrun_front
from mmddp_ext.node.threads import OMP_UNSET_ENV

from conftest import ROOT


def _text(*path: str) -> str:
    with open(osp.join(ROOT, *path)) as f:
        return f.read()


def test_the_stop_exit_code_is_one_number_everywhere():
    assert torchrun_front.STOPPED == STOPPED_EXIT_CODE
    entry = _text('tools', 'dist_train.py')
    assert re.findall(r'sys\.exit\((\d+)\)', entry) == [str(STOPPED_EXIT_CODE)]
    assert f'exit code {STOPPED_EXIT_CODE}: --resume continues' in entry
    script = _text('tools', 'dist_train.sh')
    assert re.findall(r'"\$rc" != (\d+)', script) == ['0', '2', str(STOPPED_EXIT_CODE)]
    assert torchrun_front.NOTHING_STARTED == 2


def test_the_stop_signals_are_the_same_set():
    front = {getattr(signal, name) for name in torchrun_front.STOP_SIGNALS}
    hook = set(PreemptionHook().signals)  # {number: name} of its default signals
    assert front == hook == set(WORKER_STOP_SIGNALS)
    forwarded = set(
        re.findall(r"trap '[^']*' (TERM|USR1)$", _text('tools', 'lib', 'forward_signals.sh'), re.M))
    assert {getattr(signal, f'SIG{name}') for name in forwarded} == front


def test_the_markers_between_the_front_and_the_ranks_are_the_same_names():
    assert torchrun_front.OMP_UNSET_ENV == OMP_UNSET_ENV
    entry = _text('tools', 'dist_train.py')
    assert f"os.environ.get('{torchrun_front.STOP_REQUESTED_ENV}')" in entry
