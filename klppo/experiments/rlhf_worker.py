"""One RLHF arm of ``klppo rlhf compare``, described by ``RUN_DIR/pending.yaml`` (run by the
experiments' worker process, :mod:`klppo.experiments.worker`).

An arm that started before with the same config continues from its last checkpoint; an arm
whose config changed, or that cannot be resumed exactly, starts again from scratch.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from klppo.lm.config_checks import config_from_dict
from klppo.lm.rlhf import ResumeError, resume_rlhf, rlhf
from klppo.runs.configfile import InputError, read_config_file
from klppo.runs.rundir import DirLock

log = logging.getLogger(__name__)

__all__ = ["PENDING", "run_arm"]

#: the file that marks a run directory as an RLHF arm (its config, before the run writes one)
PENDING = "pending.yaml"


def _started_with(run_dir: Path, pending: dict) -> bool:
    """Whether the run directory holds a run of exactly this config."""
    try:
        started = read_config_file(run_dir / "config.yaml")
    except InputError:
        return False
    started.pop("kind", None)
    return started == pending


def _clear(run_dir: Path) -> None:
    with DirLock(run_dir):
        for stale in ("metrics.jsonl", "checkpoint.pt", "status.json", "config.yaml"):
            (run_dir / stale).unlink(missing_ok=True)
        shutil.rmtree(run_dir / "policy", ignore_errors=True)


def run_arm(run_dir: Path) -> None:
    """Run the arm, or continue it exactly when it started before with the same config."""
    pending = read_config_file(run_dir / PENDING, "pending")
    if _started_with(run_dir, pending):
        try:
            resume_rlhf(run_dir)
            return
        except ResumeError as e:
            log.warning("%s; starting the arm again", e)
    _clear(run_dir)
    rlhf(config_from_dict(pending))
