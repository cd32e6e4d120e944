"""A function called every few seconds in a thread of its own, until stopped: progress lines
while the main thread is busy with one long call (rank 0's metric computation)."""
import threading
import time
from typing import Callable, Optional


class Ticker:
    """Calls ``tick(seconds_since_start)`` every ``interval`` seconds until :meth:`stop`.

    ``tick`` runs in a daemon thread; an exception it raises ends the ticking, never the run.

    Example::

        ticker = Ticker(60, lambda s: print(f'still working after {s:.0f} s'))
        ticker.start(); long_call(); ticker.stop()
    """

    def __init__(self, interval: float, tick: Callable[[float], None]) -> None:
        if not interval > 0:
            raise ValueError(f'Ticker interval={interval!r}: give a positive number of seconds')
        self.interval, self.tick = float(interval), tick
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._start = 0.0

    def start(self) -> None:
        """Start ticking (the first call comes ``interval`` seconds from now)."""
        self._stop.clear()
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._run, name='mmddp_ext-ticker', daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop ticking; returns once no call of ``tick`` is running."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.tick(time.monotonic() - self._start)
            except Exception:  # progress must never stop the run
                return
