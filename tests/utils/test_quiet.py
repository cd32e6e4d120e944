"""utils/quiet: each known-harmless warning is hidden only by its text, category and module
(and, for logged ones, where it is logged from); anything else from the same modules shows,
and ``MMDDP_QUIET=0`` shows everything. The real runs without the noise: tests/e2e/test_quiet.py."""
import logging
import warnings

import pytest

from mmddp_ext.utils import quiet

MKL = quiet.WARNINGS[0]
MKL_TEXT = ('Setting MKL_NUM_THREADS environment variable for each process to be 1 in default, '
            'to avoid your system being overloaded, please further tune the variable for '
            'optimal performance in your application as needed.')


def _shown(text, category=UserWarning, module=MKL.module):
    """The warnings that reach the user when ``module`` warns ``text``, after quiet_warnings."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter('always')
        quiet.quiet_warnings()
        warnings.warn_explicit(text, category, 'setup_env.py', 1, module=module)
    return [str(w.message) for w in seen]


def test_the_known_warning_is_hidden_where_it_comes_from():
    assert _shown(MKL_TEXT) == []


@pytest.mark.parametrize(
    'text, category, module',
    [
        (MKL_TEXT, UserWarning, 'my_project.setup'),  # same text, another module
        ('Setting MKL_NUM_THREADS to 4', UserWarning, MKL.module),  # another text
        (MKL_TEXT, DeprecationWarning, MKL.module),  # another category
    ])
def test_anything_else_shows(text, category, module):
    assert _shown(text, category, module) == [text]


def test_switched_off_everything_shows(monkeypatch):
    monkeypatch.setenv(quiet.QUIET_ENV, '0')
    assert _shown(MKL_TEXT) == [MKL_TEXT]


def _record(message, level=logging.WARNING):
    return logging.LogRecord('mmengine', level, __file__, 1, message, None, None)


def test_a_known_log_warning_logged_from_elsewhere_passes():
    known = quiet.LOG_WARNINGS[0].message
    log_filter = quiet.KnownLogFilter()
    assert log_filter.filter(_record(known))  # not emitted by MMEngine's file client here
    assert log_filter.filter(_record('something else'))
    assert log_filter.filter(_record(known, logging.INFO))


def test_the_log_filter_is_added_once(monkeypatch):
    logger = logging.getLogger('mmddp_ext_test_quiet')
    quiet.quiet_logger(quiet.quiet_logger(logger))
    assert sum(isinstance(f, quiet.KnownLogFilter) for f in logger.filters) == 1
    monkeypatch.setenv(quiet.QUIET_ENV, '0')
    other = logging.getLogger('mmddp_ext_test_quiet_off')
    assert quiet.quiet_logger(other).filters == []
