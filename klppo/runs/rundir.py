"""Run directories: layout, effective config, metadata, atomic files.

```
{run_dir}/
  config.yaml        the effective configuration (what actually ran)
  metadata.json      klppo version and git commit, package versions, command line, host, start
  metrics.jsonl      one JSON object per iteration, flushed as written
  checkpoint.pt      latest checkpoint (written atomically: temp file + rename)
  status.json        running / finished / failed (with the error) / interrupted
  events.*           TensorBoard events, when tensorboard is installed
```
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

__all__ = ["default_run_name", "create_run_dir", "write_metadata", "write_yaml", "read_yaml",
           "write_json_atomic", "write_status", "read_status", "atomic_write_bytes"]


def default_run_name(env: str, objective: str, seed: int) -> str:
    """``{env}__{objective}__{seed}__{time}`` with the env id made filesystem-safe."""
    safe_env = env.replace("/", "-").replace(":", "-")
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{safe_env}__{objective}__{seed}__{stamp}"


def create_run_dir(path: str | Path) -> Path:
    """Create a fresh run directory; refuse to reuse one that already holds metrics."""
    p = Path(path)
    if (p / "metrics.jsonl").exists():
        raise FileExistsError(f"out={str(p)!r} already holds a run; use --resume {p} to continue "
                              f"it or choose another --out")
    p.mkdir(parents=True, exist_ok=True)
    return p


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json_atomic(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, json.dumps(obj, indent=2, default=str).encode())


def write_yaml(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, yaml.safe_dump(obj, sort_keys=False).encode())


def read_yaml(path: Path) -> Any:
    with open(path) as f:
        return yaml.safe_load(f)


def _git_commit() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _versions(names: tuple[str, ...]) -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            out[n] = None
    return out


def write_metadata(run_dir: Path, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    import klppo

    meta = {
        "klppo_version": klppo.__version__,
        "git_commit": _git_commit(),
        "packages": _versions(("torch", "numpy", "gymnasium", "tyro", "mujoco", "box2d",
                               "transformers")),
        "python": sys.version.split()[0],
        "command_line": sys.argv,
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "start_time": datetime.now(timezone.utc).isoformat(),
        **(extra or {}),
    }
    write_json_atomic(run_dir / "metadata.json", meta)
    return meta


def write_status(run_dir: Path, state: str, **fields: Any) -> None:
    write_json_atomic(run_dir / "status.json", {"state": state, "time": time.time(), **fields})


def read_status(run_dir: Path) -> dict[str, Any] | None:
    p = Path(run_dir) / "status.json"
    if not p.exists():
        return None
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError:
        return None
