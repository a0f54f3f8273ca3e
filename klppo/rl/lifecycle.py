"""One process's life of a run directory: its lock, status and warnings."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from klppo.runs import rundir as R

log = logging.getLogger("klppo.rl.trainer")

__all__ = ["RunLife"]


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
