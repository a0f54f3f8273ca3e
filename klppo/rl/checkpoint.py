"""Atomic checkpoints of everything a run needs to continue identically."""

from __future__ import annotations

import io
import logging
import pickle
from pathlib import Path
from typing import Any

import torch

from klppo.runs.rundir import atomic_write_bytes

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint.pt"

__all__ = ["CHECKPOINT", "save_checkpoint", "load_checkpoint", "pickle_env", "unpickle_env"]


def save_checkpoint(run_dir: Path, state: dict[str, Any]) -> Path:
    """Write ``state`` to ``run_dir/checkpoint.pt`` atomically (temp file, fsync, rename): a
    kill at any moment leaves either the previous checkpoint or the new one, never half."""
    buf = io.BytesIO()
    torch.save(state, buf)
    path = Path(run_dir) / CHECKPOINT
    atomic_write_bytes(path, buf.getvalue())
    return path


def load_checkpoint(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / CHECKPOINT
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}: the run never finished an iteration")
    return torch.load(path, map_location="cpu", weights_only=False)


def pickle_env(env: Any) -> bytes | None:
    """The vector env's full state (physics, step counters, RNG) when it can be pickled.

    Without it a resumed run restarts its episodes and is no longer bit-identical to an
    uninterrupted one; that is logged, not fatal.
    """
    base = getattr(env, "unwrapped", env)
    fns = getattr(base, "env_fns", None)  # Sync/AsyncVectorEnv keep the closures that built
    try:                                   # the envs; they are only needed at construction
        if fns is not None:
            base.env_fns = None
        return pickle.dumps(env)
    except Exception as e:  # noqa: BLE001 - any env may refuse pickling in its own way
        log.warning("environment state cannot be checkpointed (%s); a resumed run will start "
                    "new episodes", e)
        return None
    finally:
        if fns is not None:
            base.env_fns = fns


def unpickle_env(data: bytes) -> Any:
    return pickle.loads(data)
