"""One RLHF arm of ``klppo rlhf compare``, described by ``RUN_DIR/pending.yaml`` (run by the
experiments' worker process, :mod:`klppo.experiments.worker`).

An arm that started before with the same config continues from its last checkpoint; one that
cannot be resumed exactly fails with the reason (its files kept, as ``klppo rlhf --resume``
keeps them); an arm whose config changed starts again from scratch (``klppo rlhf compare``
refuses an ``--out`` whose arms started with other settings before any of this).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from klppo.lm.config_checks import config_from_dict
from klppo.lm.rlhf import resume_rlhf, rlhf
from klppo.runs.configfile import InputError, read_config_file
from klppo.runs.owned import is_run_temp
from klppo.runs.rundir import DirLock

__all__ = ["PENDING", "run_arm"]

#: the file that marks a run directory as an RLHF arm (its config, before the run writes one)
PENDING = "pending.yaml"


#: what an arm's earlier start leaves, removed before the arm starts again (with the temp files
#: of the run's atomic writes and of ``pending.yaml``'s); its pending.yaml and worker.log stay
_EARLIER = ("metrics.jsonl", "checkpoint.pt", "status.json", ".status.reserve", "config.yaml",
            "metadata.json", "policy")
_PENDING_TEMP = re.compile(r"^\.pending\.yaml\.tmp\d*$")


def _started_with(run_dir: Path, pending: dict) -> bool:
    """Whether the run directory holds a run of this config (where its files go aside: the
    comparison's ``--out`` spelled another way, or the directory moved)."""
    try:
        started = read_config_file(run_dir / "config.yaml")
    except InputError:
        return False
    started.pop("kind", None)
    return {**started, "out": None} == {**pending, "out": None}


def _clear(run_dir: Path) -> None:
    with DirLock(run_dir):
        for p in sorted(run_dir.iterdir()):
            if p.name in _EARLIER or is_run_temp(p.name) or _PENDING_TEMP.match(p.name):
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p)
                else:
                    p.unlink(missing_ok=True)


def run_arm(run_dir: Path) -> None:
    """Run the arm, or continue it exactly when it started before with the same config."""
    pending = read_config_file(run_dir / PENDING, "pending")
    if _started_with(run_dir, pending):
        resume_rlhf(run_dir)  # a ResumeError fails the arm, its reason in status.json
        return
    _clear(run_dir)
    rlhf(config_from_dict(pending), keep=(PENDING, "worker.log"))
