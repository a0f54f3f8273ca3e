"""One process's life of a run directory: stop signals, lock, status and warnings."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Any

from klppo.runs import rundir as R

log = logging.getLogger("klppo.rl.trainer")

__all__ = ["StopGuard", "RunLife"]


class StopGuard:
    """A first SIGINT (Ctrl-C) or SIGTERM asks the loop to checkpoint and stop after the current
    iteration; a second one interrupts at once. Installed only in the main thread, restored on
    exit."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> StopGuard:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self.previous[sig] = signal.getsignal(sig)
                signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.trainer.stop_requested:
            raise KeyboardInterrupt
        self.trainer.stop_requested = True
        log.warning("%s: finishing this iteration, then checkpointing and stopping",
                    signal.Signals(signum).name)

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


class RunLife:
    """One process's life of a run directory: its lock, status, warnings and metric sinks."""

    def __init__(self, run_dir: Path, lock: R.DirLock, warnings: list[str]) -> None:
        self.run_dir, self.lock, self.warnings = run_dir, lock, list(warnings)

    def status(self, state: str, iteration: int, **fields: Any) -> None:
        if self.warnings:
            fields["warnings"] = self.warnings
        R.write_status(self.run_dir, state, iteration=iteration, **fields)

    def final_status(self, state: str, iteration: int, **fields: Any) -> None:
        """The status of a run that is ending on an error: best effort (the error may be the
        full disk that this write needs too)."""
        try:
            self.status(state, iteration, **fields)
        except OSError as e:
            log.error("cannot write status.json (%s); the run ended %s: %s", e, state,
                      fields.get("error"))

    def warn(self, message: str) -> None:
        log.warning("%s", message)
        self.warnings.append(message)
