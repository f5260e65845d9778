"""The inference service: the program's policy server plus a poller that applies every newer
version of the weight store in flight (`PolicyServer.load_from`, between decode steps), never
ending episodes; a failed poll is retried at the next one."""
from __future__ import annotations

import sys
import threading
import time

from composer_jax.rl.program import PolicyServer, RLProgram


class InferenceService:
    """The policy server plus a thread that applies new weight-store versions in flight."""

    def __init__(self, program: RLProgram, store, poll_s: float = 0.05):
        self.server: PolicyServer = program.make_policy()
        self.store = store
        self.poll_s = poll_s
        self.swaps = self.poll_errors = self.poll_errors_in_row = 0
        self.pinned: int | None = None     # the version to serve (rl/schedule.py); None: latest
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def wait_for_weights(self, timeout: float = 600.0) -> int:
        """Blocks until the store has a version and loads it; returns it."""
        deadline = time.monotonic() + timeout
        while self.store.latest() is None:
            if time.monotonic() > deadline:
                raise TimeoutError("no weights were published to the weight store")
            time.sleep(self.poll_s)
        self.refresh()
        return self.server.version

    def refresh(self) -> bool:
        """Loads the store's latest version if it is newer than the server's."""
        v = self.store.latest()
        if self.pinned is not None:
            if v is None or v < self.pinned or self.pinned == getattr(self.server, "version", -1):
                return False
            v = self.pinned
        elif v is None or v <= getattr(self.server, "version", -1):
            return False
        self.server.load_from(self.store, v)     # the server reads the store in its own layout
        self.swaps += 1
        return True

    def start(self) -> None:
        def loop():
            while not self._stop.is_set():
                self._wake.wait(self.poll_s)
                self._wake.clear()
                if not self._stop.is_set():
                    self._refresh_or_report()
        self._thread = threading.Thread(target=loop, name="weight-poller", daemon=True)
        self._thread.start()

    def _refresh_or_report(self) -> None:
        """One poll; a failed one (the store's index restarting, a version collected mid-read)
        is reported and retried at the next poll, never ends the poller: the server keeps
        serving the version it holds."""
        try:
            self.refresh()
            self.poll_errors_in_row = 0
        except Exception as e:  # noqa: BLE001 - any store failure: the next poll retries
            self.poll_errors += 1
            self.poll_errors_in_row += 1
            if self.poll_errors_in_row in (1, 10, 100):
                print(f"warning: weight poll failed ({self.poll_errors_in_row} in a row, serving "
                      f"version {self.version()}): {type(e).__name__}: {e}", file=sys.stderr)

    def pin(self, version: int) -> None:
        """Serve exactly `version` from now on (loaded at once if published, else when it is)."""
        self.pinned = version
        self._wake.set()

    def wake(self) -> None:
        """A new version was published: look now instead of at the next poll (same process)."""
        self._wake.set()

    def rpc(self, method: str, args: tuple, kwargs: dict):
        return self.server.rpc(method, args, kwargs)

    def version(self) -> int:
        """The weight version new episodes sample with."""
        return int(getattr(self.server, "version", -1))

    def stats(self) -> dict:
        return {**self.server.stats(), "weight_swaps": self.swaps,
                "weight_poll_errors": self.poll_errors}

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        close = getattr(self.server, "close", None)
        if close is not None:
            close()
