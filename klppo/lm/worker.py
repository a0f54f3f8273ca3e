"""``python -m klppo.lm.worker RUN_DIR``: run the RLHF arm described by RUN_DIR/pending.yaml.

An arm that started before with the same config continues from its last checkpoint; an arm
whose config changed, or that cannot be resumed exactly, starts again from scratch.
"""

from __future__ import annotations

import logging
import shutil
import sys
from pathlib import Path

from klppo.lm.config import config_from_dict
from klppo.lm.rlhf import ResumeError, resume_rlhf, rlhf
from klppo.runs.configfile import InputError, read_config_file
from klppo.runs.rundir import DirLock


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


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING)
    run_dir = Path(argv[0])
    try:
        pending = read_config_file(run_dir / "pending.yaml", "pending")
        if _started_with(run_dir, pending):
            try:
                resume_rlhf(run_dir)
                return 0
            except ResumeError as e:
                print(f"klppo rlhf worker: {e}; starting the arm again", file=sys.stderr)
        _clear(run_dir)
        rlhf(config_from_dict(pending))
    except Exception as e:  # noqa: BLE001 - status.json holds the details
        print(f"klppo rlhf worker: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
