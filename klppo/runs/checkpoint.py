"""Atomic checkpoints of everything a run needs to continue identically."""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from klppo.runs.rundir import atomic_write_bytes

CHECKPOINT = "checkpoint.pt"

__all__ = ["CHECKPOINT", "CheckpointError", "save_checkpoint", "load_checkpoint"]


class CheckpointError(RuntimeError):
    """A checkpoint that exists but cannot be read; the message names the file."""


def save_checkpoint(run_dir: Path, state: dict[str, Any]) -> Path:
    """Write ``state`` to ``run_dir/checkpoint.pt`` atomically (temp file, fsync, rename): a
    kill at any moment leaves either the previous checkpoint or the new one, never half, and a
    failed write (a full disk) leaves the previous one and no temp file."""
    buf = io.BytesIO()
    torch.save(state, buf)
    path = Path(run_dir) / CHECKPOINT
    atomic_write_bytes(path, buf.getvalue())
    return path


def load_checkpoint(run_dir: Path) -> dict[str, Any]:
    """The checkpoint's state; :class:`FileNotFoundError` when there is none and
    :class:`CheckpointError` (one line) when it is empty, truncated or corrupt."""
    path = Path(run_dir) / CHECKPOINT
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}: the run never finished an iteration")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path}: empty file; delete it to restart the run from scratch")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, zipfile.BadZipFile,
            ValueError, KeyError, AttributeError, ImportError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(f"{path}: unreadable checkpoint ({first[:200]}); delete it to "
                              f"restart the run from scratch") from None
    if not isinstance(state, dict) or "iteration" not in state:
        raise CheckpointError(f"{path}: not a klppo training checkpoint")
    return state
