"""Find and read run directories (and sweeps of them), saying what was skipped and why."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from klppo.protocol import final_return
from klppo.runs.metrics import read_metrics

__all__ = ["Run", "Loaded", "load_runs", "condition_of"]


@dataclass
class Run:
    path: Path
    config: dict[str, Any]
    metrics: list[dict[str, Any]]
    condition: str
    status: str | None
    notes: list[str] = field(default_factory=list)

    @property
    def env(self) -> str:
        return str(self.config.get("env"))

    @property
    def seed(self) -> int:
        return int(self.config.get("seed", 0))

    @property
    def objective(self) -> str:
        return str(self.config.get("objective"))

    @property
    def final_return(self) -> float:
        return final_return(self.metrics)


@dataclass
class Loaded:
    runs: list[Run]
    skipped: list[tuple[str, str]]  # (path, reason)


def condition_of(config: dict[str, Any]) -> str:
    """A readable condition label from a run's config (used outside sweeps)."""
    obj = config.get("objective", "?")
    kl = config.get("kl", {}) or {}
    ppo = config.get("ppo", {}) or {}
    if obj in ("kl_penalty", "clip_kl"):
        return f"{obj}[{kl.get('controller', 'fixed')}]"
    if obj == "per_sample_kl" and ppo.get("shape", "clip") != "clip":
        return f"per_sample_kl[{ppo.get('shape')}]"
    return str(obj)


def _load_run(path: Path, condition: str | None) -> tuple[Run | None, str | None]:
    cfg_path, met_path = path / "config.yaml", path / "metrics.jsonl"
    if not cfg_path.exists():
        return None, "no config.yaml: not a klppo run directory"
    if not met_path.exists():
        return None, "no metrics.jsonl: the run never finished an iteration"
    try:
        config = yaml.safe_load(cfg_path.read_text()) or {}
    except yaml.YAMLError as e:
        return None, f"config.yaml is unreadable: {e}"
    records, bad = read_metrics(met_path)
    records = [r for r in records if "global_step" in r]
    if not records:
        return None, "metrics.jsonl holds no complete record"
    status = None
    st = path / "status.json"
    if st.exists():
        try:
            status = json.loads(st.read_text()).get("state")
        except json.JSONDecodeError:
            status = None
    run = Run(path, config, records, condition or condition_of(config), status)
    if bad:
        run.notes.append(f"skipped {bad} malformed line(s) in metrics.jsonl (killed mid-write?)")
    if status not in (None, "finished"):
        run.notes.append(f"run status is {status!r}: its curve is partial")
    return run, None


def load_runs(paths: list[str | Path]) -> Loaded:
    """Load run directories, sweep directories (``index.json``) and parents of run dirs."""
    runs: list[Run] = []
    skipped: list[tuple[str, str]] = []
    seen: set[Path] = set()
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            skipped.append((str(p), "does not exist"))
            continue
        targets: list[tuple[Path, str | None]] = []
        if (p / "index.json").exists():
            index = json.loads((p / "index.json").read_text())
            targets = [(p / "runs" / e["name"], e.get("condition")) for e in index["runs"]]
        elif (p / "config.yaml").exists():
            targets = [(p, None)]
        else:
            children = sorted(c for c in p.iterdir() if (c / "config.yaml").exists())
            if not children:
                skipped.append((str(p), "neither a run directory nor a sweep (no config.yaml "
                                        "or index.json)"))
            targets = [(c, None) for c in children]
        for path, cond in targets:
            key = path.resolve()
            if key in seen:
                continue
            seen.add(key)
            run, why = _load_run(path, cond)
            if run is None:
                skipped.append((str(path), why or "unreadable"))
            else:
                runs.append(run)
    return Loaded(runs, skipped)
