"""The spaces of a run, saved as data: ``RUN_DIR/spaces.json``.

A run directory records the observation and action spaces its networks were built for, so
:func:`klppo.load` can rebuild the policy without the environment installed. The file is JSON
(a run directory is data, never code): a ``Box`` as its shape, dtype and bounds (``"inf"`` and
``"-inf"`` for unbounded ones), a ``Discrete`` as ``n`` and ``start``; the only spaces klppo
trains on. A single-agent run writes ``{"observation": ..., "action": ...}``; a multi-agent run
``{"policies": {NAME: {"agents": [...], "observation": ..., "action": ...}}}``. Runs written
before the file existed have none: loading them makes the environment instead.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces

from klppo.runs.errors import CheckpointError
from klppo.runs.rundir import write_json_atomic

__all__ = ["SPACES", "space_to_json", "space_from_json", "write_spaces", "read_spaces"]

SPACES = "spaces.json"
#: the most values a saved space may hold (an observation's size, or Discrete's n): larger ones
#: are not a space klppo trained, and are refused before anything is allocated
MAX_VALUES = 1_000_000

_DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
           "uint16", "uint32", "uint64", "bool")


def _number(x: float) -> float | str:
    """JSON has no infinities: unbounded ends are written as the strings ``"inf"``/``"-inf"``."""
    return x if math.isfinite(x) else str(x)


def space_to_json(space: Any) -> dict[str, Any]:
    """A ``Box`` or ``Discrete`` as a JSON-ready mapping (:func:`space_from_json` reads it
    back equal); ValueError for any other space."""
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.Box):
        bound = [[_number(float(v)) for v in np.ravel(b)] for b in (space.low, space.high)]
        return {"type": "Box", "shape": list(space.shape), "dtype": str(space.dtype),
                "low": bound[0], "high": bound[1]}
    raise ValueError(f"{space}: only Box and Discrete spaces are saved")


def _floats(values: Any, size: int, where: str) -> np.ndarray:
    if not isinstance(values, list) or len(values) != size:
        raise CheckpointError(f"{where}: a bound must be a list of {size} numbers")
    out = []
    for v in values:
        if isinstance(v, str) and v in ("inf", "-inf"):
            out.append(float(v))
        elif isinstance(v, float) and math.isnan(v) or v == "nan":
            raise CheckpointError(f"{where}: a bound is NaN (klppo writes numbers or +-inf)")
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append(float(v))
        else:
            raise CheckpointError(f"{where}: bound value {v!r} is not a number")
    return np.asarray(out, dtype=np.float64)


def space_from_json(d: Any, where: str) -> spaces.Space:
    """The space :func:`space_to_json` wrote; :class:`CheckpointError` naming ``where`` (the
    file and the entry) for anything else."""
    if not isinstance(d, dict) or d.get("type") not in ("Box", "Discrete"):
        raise CheckpointError(f"{where}: not a Box or Discrete space ({str(d)[:80]})")
    if d["type"] == "Discrete":
        n, start = d.get("n"), d.get("start", 0)
        if not (isinstance(n, int) and not isinstance(n, bool)
                and isinstance(start, int) and not isinstance(start, bool)) or n < 1:
            raise CheckpointError(f"{where}: Discrete needs integers n >= 1 and start")
        if n > MAX_VALUES or start != 0:
            raise CheckpointError(f"{where}: Discrete(n={n}, start={start}): klppo trains "
                                  f"actions 0 .. n - 1 with n at most {MAX_VALUES:,}")
        return spaces.Discrete(n, start=start)
    shape, dtype = d.get("shape"), d.get("dtype")
    if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool)
                                              and s >= 0 for s in shape):
        raise CheckpointError(f"{where}: Box shape {shape!r} is not a list of sizes")
    if dtype not in _DTYPES:
        raise CheckpointError(f"{where}: Box dtype {dtype!r} is not one of {list(_DTYPES)}")
    size = math.prod(shape)
    if not 1 <= size <= MAX_VALUES:
        raise CheckpointError(f"{where}: Box shape {shape} holds {size:,} values; klppo's "
                              f"networks take 1 to {MAX_VALUES:,}")
    low, high = (_floats(d.get(k), size, where).reshape(shape) for k in ("low", "high"))
    if (low > high).any():
        raise CheckpointError(f"{where}: a lower bound exceeds its upper bound")
    return spaces.Box(low.astype(dtype), high.astype(dtype), shape=tuple(shape), dtype=dtype)


def write_spaces(run_dir: Path, observation: Any = None, action: Any = None,
                 policies: dict[str, tuple[list[str], Any, Any]] | None = None) -> Path:
    """Write ``RUN_DIR/spaces.json`` (atomically): one observation and action space, or
    ``policies`` name -> (agents, observation space, action space)."""
    if policies is not None:
        data: dict[str, Any] = {"policies": {
            p: {"agents": list(agents), "observation": space_to_json(o),
                "action": space_to_json(a)} for p, (agents, o, a) in policies.items()}}
    else:
        data = {"observation": space_to_json(observation), "action": space_to_json(action)}
    path = Path(run_dir) / SPACES
    write_json_atomic(path, data)
    return path


def read_spaces(run_dir: Path) -> dict[str, Any] | None:
    """The spaces a run recorded, read back as spaces (same layout as written), or None when
    the run has no ``spaces.json`` (written before klppo saved it). :class:`CheckpointError`
    naming the file when it cannot be read."""
    path = Path(run_dir) / SPACES
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as e:
        raise CheckpointError(f"{path}: unreadable ({type(e).__name__}); delete it to make "
                              f"the spaces from the environment again") from None
    if isinstance(data, dict) and "policies" in data:
        pols = data["policies"]
        if not isinstance(pols, dict) or not pols:
            raise CheckpointError(f"{path}: 'policies' must map policy names to their spaces")
        out = {}
        for p, entry in pols.items():
            agents = entry.get("agents") if isinstance(entry, dict) else None
            if not isinstance(agents, list) or not all(isinstance(a, str) for a in agents) \
                    or not agents:
                raise CheckpointError(f"{path}: policy {p!r} names no agents")
            out[p] = (agents, space_from_json(entry.get("observation"), f"{path} ({p})"),
                      space_from_json(entry.get("action"), f"{path} ({p})"))
        return {"policies": out}
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: holds {type(data).__name__}, not a mapping")
    return {"observation": space_from_json(data.get("observation"), f"{path} (observation)"),
            "action": space_from_json(data.get("action"), f"{path} (action)")}
