"""Our log lines: the tag, MMEngine's current logger, the level, rank 0 only on request."""
import itertools
import logging

from mmengine.logging import MMLogger

from mmddp_ext.utils import log

_names = itertools.count()


def _printed(capsys, monkeypatch, rank, **kwargs):
    """What MMEngine's current logger (made here, so it prints into capsys) printed."""
    monkeypatch.setattr(log, 'get_rank', lambda: rank)
    MMLogger.get_instance(f'mmddp_ext_test_log_{next(_names)}')  # now the current one
    capsys.readouterr()
    log.log_line('batch probe: 3 fits', **kwargs)
    return [line.split(' - ', 2)[-1] for line in capsys.readouterr().out.splitlines()]


def test_a_line_is_tagged_at_its_level_on_every_rank(capsys, monkeypatch):
    assert _printed(capsys, monkeypatch, 1) == ['INFO - [mmddp_ext] batch probe: 3 fits']
    assert _printed(capsys, monkeypatch, 1,
                    level=logging.WARNING) == ['WARNING - [mmddp_ext] batch probe: 3 fits']


def test_rank0_only_is_silent_elsewhere(capsys, monkeypatch):
    assert _printed(capsys, monkeypatch, 0,
                    rank0_only=True) == ['INFO - [mmddp_ext] batch probe: 3 fits']
    assert _printed(capsys, monkeypatch, 1, rank0_only=True) == []
