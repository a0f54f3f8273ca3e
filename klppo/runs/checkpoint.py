"""Atomic checkpoints of everything a run needs to continue identically.

A checkpoint is data, never code: it is read with ``torch.load(weights_only=True)``, whose
unpickler builds tensors, numbers, strings, containers and the numpy arrays and scalars allowed
below, and refuses every other global (a pickled object that would run a command is refused
before anything runs). A run directory copied from someone else is safe to resume, evaluate or
load.
"""

from __future__ import annotations

import io
import math
import pickle
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from klppo.runs.atomic import atomic_write_bytes
from klppo.runs.errors import CheckpointError

CHECKPOINT = "checkpoint.pt"

__all__ = ["CHECKPOINT", "CheckpointError", "save_checkpoint", "checkpoint_file", "load_checkpoint",
           "load_data", "check_finite"]

# numpy<2 fallback; numpy 2's stubs do not list np.core.multiarray
_MULTIARRAY = (np._core.multiarray if hasattr(np, "_core")
               else np.core.multiarray)  # type: ignore[attr-defined]
#: the only globals a checkpoint may name: numpy arrays, their dtypes and numpy scalars
SAFE_GLOBALS = [_MULTIARRAY._reconstruct, _MULTIARRAY.scalar, np.ndarray, np.dtype,
                *(getattr(np.dtypes, n) for n in dir(np.dtypes) if n.endswith("DType"))]


def save_checkpoint(run_dir: Path, state: dict[str, Any]) -> Path:
    """Write ``state`` to ``run_dir/checkpoint.pt`` atomically (temp file, fsync, rename): a
    kill at any moment leaves either the previous checkpoint or the new one, never half, and a
    failed write (a full disk) leaves the previous one and no temp file."""
    path, data = checkpoint_file(run_dir, state)
    atomic_write_bytes(path, data)
    return path


def checkpoint_file(run_dir: Path, state: dict[str, Any]) -> tuple[Path, bytes]:
    """``run_dir/checkpoint.pt`` and the bytes of ``state`` it holds, for an atomic write
    (:func:`save_checkpoint`, or a group's :func:`~klppo.runs.atomic.atomic_write_all`)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    return Path(run_dir) / CHECKPOINT, buf.getvalue()


def load_checkpoint(run_dir: Path) -> dict[str, Any]:
    """The checkpoint's state; :class:`FileNotFoundError` when there is none and
    :class:`CheckpointError` (one line) when it is empty, truncated or corrupt."""
    path = Path(run_dir) / CHECKPOINT
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}: the run never finished an iteration")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path}: empty file; delete it to restart the run from scratch")
    state = load_data(path, "delete it to restart the run from scratch")
    if not isinstance(state, dict) or not isinstance(state.get("iteration"), int) \
            or isinstance(state["iteration"], bool) or state["iteration"] < 0:
        raise CheckpointError(f"{path}: not a klppo training checkpoint (no iteration count)")
    check_finite(state, path)
    return state


def check_finite(state: Any, path: Path) -> None:
    """A checkpoint klppo wrote holds no NaN anywhere and no infinity in a tensor or an array
    (weights, optimiser moments, normalisers, episode sums; a bound such as ``beta_max`` may be
    an infinite number). CheckpointError naming the first entry otherwise."""
    bad = _non_finite(state, "")
    if bad is not None:
        raise CheckpointError(f"{path}: {bad or 'the state'} holds a non-finite value; klppo "
                              f"never writes one, so the file was damaged or forged")


def _non_finite(x: Any, where: str) -> str | None:
    if isinstance(x, dict):
        items: Any = x.items()
    elif isinstance(x, (list, tuple)):
        items = enumerate(x)
    elif isinstance(x, torch.Tensor):
        ok = not x.is_floating_point() or bool(torch.isfinite(x).all())
        return None if ok else where
    elif isinstance(x, np.ndarray):
        ok = x.dtype.kind not in "fc" or bool(np.isfinite(x).all())
        return None if ok else where
    elif isinstance(x, (float, np.floating)):
        return where if math.isnan(x) else None
    else:
        return None
    for k, v in items:
        found = _non_finite(v, f"{where}.{k}" if where else str(k))
        if found is not None:
            return found
    return None


def load_data(path: Path, remedy: str) -> Any:
    """What a torch file holds, read as data only (see the module's docstring); one-line
    :class:`CheckpointError` naming ``path`` when it is unreadable or names any other global
    (``remedy`` says what the user can do)."""
    try:
        # torch warns (stderr, with a source line) on a file of the legacy pickle format: the
        # refusal below says what matters, in one line
        with torch.serialization.safe_globals(SAFE_GLOBALS), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*pickle protocol", category=UserWarning)
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"GLOBAL ([\w.]+)|got <\w+ '?([\w.]+)", str(e))
        if found:
            name = found.group(1) or found.group(2)
            raise CheckpointError(f"{path}: refused: the file names {name}, and klppo loads "
                                  f"only tensors, numbers and arrays from a run directory, "
                                  f"never code") from None
        raise CheckpointError(f"{path}: unreadable checkpoint (not a torch file of data); "
                              f"{remedy}") from None
    except (RuntimeError, EOFError, OSError, zipfile.BadZipFile, ValueError, KeyError,
            AttributeError, ImportError, TypeError, IndexError, MemoryError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(f"{path}: unreadable checkpoint ({first[:200]}); "
                              f"{remedy}") from None
