"""A graceful stop for long loops: the first SIGINT / SIGTERM asks, a second one insists."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["StopRequest"]


class StopRequest:
    """Context manager: a first SIGINT (Ctrl-C) or SIGTERM sets :attr:`requested` (the loop
    finishes its iteration, checkpoints and stops); a second one raises ``KeyboardInterrupt`` at
    once. Installed only in the main thread; the previous handlers are restored on exit."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.requested = False
        self.signum: int | None = None  # the signal of the last request
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.getsignal(sig)
                signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.signum = signum
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        log.warning("%s: finishing this iteration, then checkpointing and stopping (a second "
                    "one stops at once)", signal.Signals(signum).name)

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
