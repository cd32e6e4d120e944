"""Ticker: calls come from their own thread until stop(), none after it returns; an error in
the call ends the ticking, not the caller."""
import threading

import pytest

from mmddp_ext.utils.ticker import Ticker


def test_ticks_until_stopped_and_never_after():
    calls, two = [], threading.Event()

    def tick(seconds: float) -> None:
        calls.append((seconds, threading.current_thread() is threading.main_thread()))
        if len(calls) == 2:
            two.set()

    ticker = Ticker(0.01, tick)
    ticker.start()
    assert two.wait(60)
    ticker.stop()
    stopped = len(calls)
    assert all(not on_main for _, on_main in calls)
    assert 0 < calls[0][0] <= calls[1][0]  # seconds since start
    assert len(calls) == stopped  # stop() joined the thread: no call after it


def test_an_error_in_the_call_ends_the_ticking_quietly(capsys):
    calls, raised = [], threading.Event()

    def tick(seconds: float) -> None:
        calls.append(seconds)
        raised.set()
        raise RuntimeError('broken')

    ticker = Ticker(0.01, tick)
    ticker.start()
    assert raised.wait(60)
    ticker.stop()
    assert len(calls) == 1  # the first error ended it
    assert 'broken' not in capsys.readouterr().err  # no thread traceback on the user's screen


def test_bad_interval_names_the_value():
    with pytest.raises(ValueError, match='interval=0'):
        Ticker(0, print)
