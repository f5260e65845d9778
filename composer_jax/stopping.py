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

Blocks nest: a signal sets every active block's flag, and a block entered after a stop was asked
for starts requested. `launch.py` opens an outer block for experiments registered `stoppable`
as soon as the experiment is known (after `record_early_signals()`, which notes a signal that
arrives while the program is still importing), so a signal during set-up still ends in a clean
stop: the loop stops at once and checkpoints where it is.

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
_EARLY: list[str] = []          # signals noted by record_early_signals() before any block


def record_early_signals() -> None:
    """Until a `stop_signals` block or `restore_default_signals()`, SIGTERM / SIGINT are only
    noted (a block entered later starts requested)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum, frame):
        _EARLY.append(signal.Signals(signum).name)
        print(f"\n{signal.Signals(signum).name} while starting up: noted",
              file=sys.stderr, flush=True)
    for s in _SIGNALS:
        signal.signal(s, handler)


def restore_default_signals() -> None:
    """For code with no clean stop: the default handlers again, and a signal noted early acts
    now (SIGTERM ends the process; SIGINT raises KeyboardInterrupt)."""
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if "SIGTERM" in _EARLY:
        signal.raise_signal(signal.SIGTERM)
    if "SIGINT" in _EARLY:
        raise KeyboardInterrupt


def request_stop() -> None:
    """Asks every active `stop_signals` block to stop after its current step."""
    for flag in list(_ACTIVE):
        flag.set()


@contextlib.contextmanager
def stop_signals(message: str = "stopping after the current step (again to abort)"):
    """Installs the SIGTERM / SIGINT handlers described in the module docstring."""
    flag = StopFlag()
    earlier = [f.signal_name or "a stop request" for f in _ACTIVE if f.requested] + _EARLY
    if earlier:
        flag.set(earlier[0])
    _ACTIVE.append(flag)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        def handler(signum, frame):
            name = signal.Signals(signum).name
            if flag.requested and signum == signal.SIGINT:
                raise KeyboardInterrupt
            if not flag.requested:
                print(f"\n{name}: {message}", file=sys.stderr, flush=True)
            for f in list(_ACTIVE):          # nested blocks: every one stops
                f.set(name)
        for s in _SIGNALS:
            previous[s] = signal.signal(s, handler)
    try:
        yield flag
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        _ACTIVE.remove(flag)
