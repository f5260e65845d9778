"""Clean stops on SIGTERM / SIGINT (Ctrl-C) for the long loops (training, RL).

    with stop_signals() as stop:          # in the main thread
        while not stop.requested:
            ...one step...
        if stop.requested: save, write plots and the summary, print where they are, return

Inside the block the first SIGTERM or SIGINT only sets `stop.requested` (and `stop.signal_name`):
the loop finishes its current step, checkpoints and returns normally, so the process exits 0. A
second SIGINT while stopping raises KeyboardInterrupt (for a user who does not want to wait).
Outside the block the previous handlers apply: SIGTERM ends the process at once (nothing is being
trained yet), and `launch.py` turns a Ctrl-C there into a one-line message instead of a traceback.

`request_stop()` sets the flag from code (tests, a notebook's stop button); off the main thread
`stop_signals` installs nothing and only that flag works.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopFlag:
    """Whether a stop was asked for, and by which signal ("" when by code)."""

    def __init__(self):
        self._event = threading.Event()
        self.signal_name = ""

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def is_set(self) -> bool:
        """The same as `requested` (so a flag stands in for a threading.Event)."""
        return self._event.is_set()

    def set(self, signal_name: str = "") -> None:
        if not self._event.is_set():
            self.signal_name = signal_name
        self._event.set()

    def describe(self) -> str:
        return self.signal_name or "a stop request"


_ACTIVE: list[StopFlag] = []


def request_stop() -> None:
    """Asks every active `stop_signals` block to stop after its current step."""
    for flag in list(_ACTIVE):
        flag.set()


@contextlib.contextmanager
def stop_signals(message: str = "stopping after the current step (again to abort)"):
    """Installs the SIGTERM / SIGINT handlers described in the module docstring."""
    flag = StopFlag()
    _ACTIVE.append(flag)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        def handler(signum, frame):
            name = signal.Signals(signum).name
            if flag.requested and signum == signal.SIGINT:
                raise KeyboardInterrupt
            if not flag.requested:
                print(f"\n{name}: {message}", file=sys.stderr, flush=True)
            flag.set(name)
        for s in _SIGNALS:
            previous[s] = signal.signal(s, handler)
    try:
        yield flag
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        _ACTIVE.remove(flag)
