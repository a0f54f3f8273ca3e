"""One process's life of a run directory: reading it back, its lock, status and warnings."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from klppo.rl.config import ConfigError, TrainConfig, from_dict, validate
from klppo.runs import metrics as M
from klppo.runs import rundir as R

log = logging.getLogger("klppo.rl.trainer")

__all__ = ["RunLife", "ResumeError", "read_run_config", "check_metrics"]


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


class ResumeError(RuntimeError):
    """A run directory cannot be resumed; the message names the file and the reason."""


def read_run_config(run_dir: str | Path) -> TrainConfig:
    """The validated config of a run directory; one-line errors for a missing directory, a
    missing or malformed ``config.yaml`` or bad values in it."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise ResumeError(f"resume={str(run_dir)!r}: no such directory")
    if not run_dir.is_dir():
        raise ResumeError(f"resume={str(run_dir)!r}: not a directory")
    if not (run_dir / "config.yaml").exists():
        raise ResumeError(f"resume={str(run_dir)!r}: not a klppo run directory (no config.yaml)")
    path = run_dir / "config.yaml"
    cfg = from_dict(R.read_yaml(path), source=str(path))
    try:
        return validate(cfg)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def check_metrics(run_dir: Path, iteration: int) -> list[dict[str, Any]]:
    """The metrics kept up to the checkpoint's iteration; an error when some are missing."""
    path = run_dir / "metrics.jsonl"
    records = M.read_metrics(path)[0] if path.exists() else []
    kept = [r for r in records if isinstance(r.get("iteration"), int)
            and r["iteration"] <= iteration]
    if [r["iteration"] for r in kept] != list(range(1, iteration + 1)):
        have = "is missing" if not path.exists() else f"holds {len(kept)} of them"
        raise ResumeError(f"{path}: the checkpoint is at iteration {iteration} but the file "
                          f"{have}; the run cannot be resumed exactly (restore the file, or "
                          f"delete checkpoint.pt to restart the run)")
    return kept
