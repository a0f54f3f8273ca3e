"""A klppo controller's state in a peer trainer's checkpoint: one JSON file beside its files.

TRL: written by the callback's ``on_save`` into ``OUTPUT_DIR/checkpoint-STEP/`` (after the
trainer has written the checkpoint, which transformers does right after the log of the same
step, so the state includes that step's controller update); read back when ``trainer.train(
resume_from_checkpoint=...)`` starts. verl: written after ``_save_checkpoint`` into
``default_local_dir/global_step_N/``, read after ``_load_checkpoint``. JSON floats round-trip
exactly (``repr``), so the restored controller continues the same beta trajectory.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from klppo.core.controllers import KLController

__all__ = ["STATE_FILE", "FORMAT", "settings_of", "write_state", "read_state", "load_controller"]

STATE_FILE = "klppo_kl_controller.json"
#: the format written by the TRL bridge (each bridge names its own)
FORMAT = "klppo.integrations.trl/1"


def settings_of(controller: KLController) -> dict[str, Any]:
    """What must match between the saved and the resuming controller: its rule and bounds."""
    return {"name": controller.name, "target": controller.target,
            "beta_min": controller.beta_min, "beta_max": controller.beta_max}


def write_state(checkpoint: Path, state: dict[str, Any], fmt: str = FORMAT,
                name: str = STATE_FILE) -> Path:
    """Write ``state`` atomically (a temporary file renamed over the final one)."""
    path = checkpoint / name
    tmp = checkpoint / f".{name}.tmp"
    tmp.write_text(json.dumps({"format": fmt, **state}, indent=1, allow_nan=True))
    os.replace(tmp, path)
    return path


def load_controller(controller: Any, state: dict[str, Any], checkpoint: Path,
                    name: str = STATE_FILE) -> None:
    """``controller.load_state_dict(state["controller"])``; ``RuntimeError`` (one line naming the
    file and the field) when the saved controller is not a valid state of this rule."""
    try:
        controller.load_state_dict(state.get("controller"))
    except (ValueError, TypeError, KeyError) as e:
        raise RuntimeError(f"{checkpoint / name}: controller: {e}") from None


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


def read_state(checkpoint: Path, expect: dict[str, Any], fmt: str = FORMAT,
               name: str = STATE_FILE) -> dict[str, Any]:
    """The saved state of ``checkpoint``; ``RuntimeError`` (one line naming the file) when it is
    missing, unreadable, of another format, or when a field of ``expect`` (trainer, unit,
    controller settings, global step) differs from the saved one."""
    path = checkpoint / name
    if not path.is_file():
        raise RuntimeError(
            f"{path}: no klppo controller state; a checkpoint written without the callback (or "
            "by a process killed between TRL's save and the callback's) cannot continue the "
            "beta trajectory")
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as e:
        why = "nested too deeply" if isinstance(e, RecursionError) else f"{type(e).__name__}: {e}"
        raise RuntimeError(f"{path}: unreadable ({why})") from None
    if not isinstance(state, dict) or state.get("format") != fmt:
        raise RuntimeError(f"{path}: not a {fmt} state file")
    for key, want in expect.items():
        got = state.get(key)
        if isinstance(want, dict) and isinstance(got, dict):
            diff = [k for k in want if not _same(want[k], got.get(k))]
            if diff:
                raise RuntimeError(
                    f"{path}: saved {key} {got} differs from this run's {want} in {diff}")
        elif not _same(got, want):
            raise RuntimeError(f"{path}: saved {key}={got!r}, this run has {key}={want!r}")
    return state
