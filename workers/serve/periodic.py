"""A daemon thread that runs one action at a fixed interval until stopped."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

__all__ = ["Periodic"]

logger = logging.getLogger(__name__)


class Periodic:
    """Runs `action` every `interval_s` seconds on its own thread, from `start()` to `stop()`.

    NOTE: a failing run is logged with its traceback (`failure_message`, %-style with `args`)
    and the next one goes ahead: the threads that use this (state publisher, step samples)
    must survive a Redis or database hiccup.
    """

    def __init__(self, name: str, interval_s: float, action: Callable[[], None],
                 failure_message: str, *args: object) -> None:
        self.name = name
        self.interval_s = interval_s
        self.action = action
        self._failure = (failure_message, args)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def signal_stop(self) -> None:
        """Ask the thread to end after its current run; `join()` waits for it."""
        self._stop.set()

    def join(self, timeout_s: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.action()
            except Exception:  # noqa: BLE001 - logged; the next run may succeed
                message, args = self._failure
                logger.exception(message, *args)
