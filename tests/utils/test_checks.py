"""Positive-value checks (pure): what passes, what fails, and the messages callers keep."""
import os.path as osp
import re
import subprocess
import sys

import pytest

from mmddp_ext.utils.checks import (is_positive_int, is_positive_number, positive_int,
                                    positive_number, true_or_false)

CHECKS = osp.join(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))), 'mmddp_ext', 'utils', 'checks.py')
NAN, INF = float('nan'), float('inf')


@pytest.mark.parametrize('value, ok', [
    (1, True), (64, True), (10**30, True),
    (0, False), (-1, False), (True, False), (False, False), (1.0, False), (1.5, False),
    ('3', False), (None, False), (NAN, False), (INF, False), ([1], False),
])  # yapf: disable
def test_is_positive_int(value, ok):
    assert is_positive_int(value) is ok


@pytest.mark.parametrize('value, finite, loose', [
    (1, True, True), (0.5, True, True), (1e-9, True, True),
    pytest.param(10**400, True, True, id='10**400'),  # too large for a float, still finite
    (INF, False, True), (NAN, False, True),  # only the loose check lets these through
    (0, False, False), (0.0, False, False), (-1, False, False), (-INF, False, False),
    (True, False, False), (False, False, False), ('3', False, False), (None, False, False),
])  # yapf: disable
def test_is_positive_number(value, finite, loose):
    assert is_positive_number(value) is finite
    assert is_positive_number(value, finite=False) is loose


def test_positive_int_returns_the_value_or_names_it():
    assert positive_int('upper', 8) == 8
    with pytest.raises(ValueError) as info:
        positive_int('upper', True, hint=', e.g. 64')
    assert str(info.value) == 'upper=True must be a positive int, e.g. 64'
    with pytest.raises(TypeError, match=r"^n='3' must be a positive integer$"):
        positive_int('n', '3', 'a positive integer', error=TypeError)


def test_positive_number_returns_the_value_or_names_it():
    assert positive_number('t', 0.25) == 0.25
    assert positive_number('t', INF, finite=False) == INF
    with pytest.raises(ValueError, match=r'^t=inf must be a positive number$'):
        positive_number('t', INF)
    with pytest.raises(ValueError) as info:
        positive_number('t', 0, 'a positive number of seconds', ' or None (automatic)')
    assert str(info.value) == 't=0 must be a positive number of seconds or None (automatic)'
    with pytest.raises(ValueError, match=r'^t=nan must be'):
        positive_number('t', NAN)


def _memory_hook(interval):
    from mmddp_ext.hooks.memory_hook import RankMemoryHook
    return RankMemoryHook(interval=interval)


def _watchdog(**kwargs):
    from mmddp_ext.hooks.watchdog_hook import HangWatchdogHook
    return HangWatchdogHook(**kwargs)


def _search(upper):
    from mmddp_ext.batch_finder.search import search_max_batch
    return search_max_batch(upper, lambda batch: True)


def _seconds(raw):
    from mmddp_launch.rendezvous import seconds_from_env
    return seconds_from_env({'WAIT': raw}, 'WAIT', 30.0)


def _sizes(**kwargs):
    from mmddp_ext.demo.pose import check_sizes
    return check_sizes(**{'num_train': 4, 'num_val': 2, 'size': 64, 'what': 'x', **kwargs})


@pytest.mark.parametrize('call, message', [
    (lambda: _memory_hook(True), 'RankMemoryHook interval=True must be a positive integer '
     '(iterations between samples), e.g. interval=50'),
    (lambda: _watchdog(timeout=0), 'HangWatchdogHook timeout=0 must be a positive number of '
     'seconds or None (automatic)'),
    (lambda: _watchdog(window=False), 'HangWatchdogHook window=False must be a positive number '
     'of iterations'),
    (lambda: _search(0), 'upper=0 must be a positive int: the largest per-device batch worth '
     'trying, e.g. 64'),
    (lambda: _seconds('inf'), "WAIT='inf' must be a positive number of seconds, e.g. 30"),
    (lambda: _seconds('nan'), "WAIT='nan' must be a positive number of seconds, e.g. 30"),
    (lambda: _sizes(num_val=2.5), 'num_val must be a positive integer, got 2.5'),
], ids=['memory hook', 'watchdog timeout', 'watchdog window', 'search', 'env inf', 'env nan',
        'demo sizes'])  # yapf: disable
def test_call_sites_keep_their_messages(call, message):
    with pytest.raises(ValueError) as info:
        call()
    assert str(info.value) == message


def test_call_sites_accept_what_they_always_did():
    assert _memory_hook(1).interval == 1
    assert _watchdog(timeout=0.5, window=2.5).timeout == 0.5  # numbers, not only ints
    assert _seconds('1e-3') == 0.001 and _seconds('') == 30.0  # empty: the default
    assert _search(1).max_batch == 1


def test_loads_with_the_standard_library_only():
    """The lightest modules may use it: loading it (here by path, without the package) pulls in
    neither torch, MMEngine nor numpy."""
    code = ('import importlib.util, sys\n'
            f'spec = importlib.util.spec_from_file_location("checks", {CHECKS!r})\n'
            'module = importlib.util.module_from_spec(spec)\n'
            'spec.loader.exec_module(module)\n'
            'assert module.is_positive_number(2.5)\n'
            'print(sorted(m for m in sys.modules if m.split(".")[0] in '
            '("mmddp_ext", "mmengine", "torch", "numpy")))\n')
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == '[]'


@pytest.mark.parametrize('value', [True, False])
def test_a_bool_is_true_or_false(value):
    assert true_or_false('SomeHook: enabled', value) is value


@pytest.mark.parametrize('value', [0, 1, 'false', None])
def test_anything_else_is_named(value):
    with pytest.raises(ValueError, match=re.escape(f'SomeHook: enabled={value!r} must be True or '
                                                   'False')):
        true_or_false('SomeHook: enabled', value)
