"""Sweeps: a grid of conditions x seeds, each run through the same entry point as ``klppo train``.

A sweep directory holds ``spec.yaml`` (what was asked), ``index.json`` (one entry per run:
name, condition, seed, overrides, state, error) and ``runs/{name}/`` run directories. Re-running
a sweep skips finished runs and resumes unfinished ones from their checkpoints. Every run is its
own process (``python -m klppo.runs.worker RUN_DIR``), so a crash, even a segfault, takes down
only that run; the sweep records its error and traceback and carries on.

Backends: ``local`` (default) runs at most ``workers`` processes at once on this machine;
``ray`` submits the same worker function as Ray tasks (one CPU each) to the cluster named by
``RAY_ADDRESS`` (or a local instance), for a user who outgrows one machine.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from klppo.rl import config as C
from klppo.runs import rundir as R

log = logging.getLogger(__name__)

__all__ = ["SweepSpec", "RunEntry", "SweepResult", "expand", "run_sweep", "run_one",
           "DEMO_SPEC"]

Backend = Literal["local", "ray"]


@dataclass
class SweepSpec:
    """What to run: a base config, named conditions, a grid over any field, and seeds."""

    preset: str | None = "klip/cartpole"
    """base preset (None: TrainConfig defaults)"""
    base: dict[str, Any] = field(default_factory=dict)
    """overrides applied to every run (nested dict, e.g. {"total_steps": 50000})"""
    conditions: dict[str, dict[str, Any]] = field(default_factory=dict)
    """named overrides, one condition each (empty: a single condition "base")"""
    grid: dict[str, list[Any]] = field(default_factory=dict)
    """dotted field -> values; the product is crossed with every condition"""
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    """seeds run for every condition"""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SweepSpec:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise C.ConfigError(f"sweep spec: unknown key(s) {sorted(unknown)}; "
                                f"known: {sorted(known)}")
        return cls(**d)


@dataclass
class RunEntry:
    name: str
    condition: str
    seed: int
    overrides: dict[str, Any]
    state: str = "pending"
    error: str | None = None
    wall_s: float | None = None
    """wall time of this run's worker process in this sweep invocation (None: skipped)"""


@dataclass
class SweepResult:
    sweep_dir: Path
    entries: list[RunEntry]

    @property
    def failed(self) -> list[RunEntry]:
        return [e for e in self.entries if e.state != "finished"]


def _dotted(d: dict[str, Any]) -> dict[str, Any]:
    """{"a.b": 1} -> {"a": {"b": 1}}, merging nested dicts."""
    out: dict[str, Any] = {}
    for key, value in d.items():
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        if isinstance(value, dict) and isinstance(node.get(parts[-1]), dict):
            node[parts[-1]].update(value)
        else:
            node[parts[-1]] = value
    return out


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def expand(spec: SweepSpec) -> list[tuple[RunEntry, C.TrainConfig]]:
    """Every (condition x grid point x seed) as a run entry and its validated config."""
    base_cfg = C.preset(spec.preset) if spec.preset else C.TrainConfig()
    base_cfg = C.from_dict(_dotted(spec.base), base_cfg)
    conditions = spec.conditions or {"base": {}}
    keys = list(spec.grid)
    points = list(itertools.product(*(spec.grid[k] for k in keys))) or [()]
    out = []
    for cname, cover in conditions.items():
        for point in points:
            label = cname + "".join(f"__{k.split('.')[-1]}={v}" for k, v in zip(keys, point)
                                    if k != "env")  # the env already leads the run name
            overrides = _merge(_dotted(cover), _dotted(dict(zip(keys, point))))
            for seed in spec.seeds:
                cfg = C.from_dict({**overrides, "seed": seed}, base_cfg)
                C.validate(cfg)
                safe_env = cfg.env.replace("/", "-").replace(":", "-")
                name = f"{safe_env}__{label}__{seed}"
                out.append((RunEntry(name, label, seed, overrides), cfg))
    names = [e.name for e, _ in out]
    if len(set(names)) != len(names):
        raise C.ConfigError("sweep spec: two runs get the same name; make condition names "
                            "unique")
    return out


def run_one(run_dir: str) -> dict[str, Any]:
    """Run (or resume, or skip) one sweep run in a fresh Python process; never raises.

    Returns ``{"state", "error", "wall_s"}``. This is the function the local pool and Ray
    both call.
    """
    run_dir = str(run_dir)
    status = R.read_status(Path(run_dir))
    if status and status.get("state") == "finished":
        return {"state": "finished", "error": None, "wall_s": None}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "klppo.runs.worker", run_dir],
                          capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    status = R.read_status(Path(run_dir)) or {}
    if proc.returncode == 0 and status.get("state") == "finished":
        return {"state": "finished", "error": None, "wall_s": wall}
    err = status.get("error") or f"worker exited with code {proc.returncode}"
    tb = status.get("traceback") or proc.stderr[-4000:]
    if status.get("state") != "failed":  # killed from outside, or a hard crash
        R.write_status(Path(run_dir), "failed", error=err, traceback=tb)
    return {"state": "failed", "error": err, "traceback": tb, "wall_s": wall}


def _write_index(sweep_dir: Path, entries: list[RunEntry]) -> None:
    R.write_json_atomic(sweep_dir / "index.json",
                        {"runs": [dataclasses.asdict(e) for e in entries]})


def run_sweep(
    spec: SweepSpec,
    sweep_dir: str | Path,
    backend: Backend = "local",
    workers: int | None = None,
    on_done: Callable[[RunEntry], None] | None = None,
) -> SweepResult:
    """Run every run of ``spec`` under ``sweep_dir``; idempotent and crash-isolated."""
    sweep_dir = Path(sweep_dir)
    planned = expand(spec)
    spec_path = sweep_dir / "spec.yaml"
    spec_dict = dataclasses.asdict(spec)
    if spec_path.exists() and R.read_yaml(spec_path) != spec_dict:
        raise C.ConfigError(f"{sweep_dir} holds a different sweep spec; choose another "
                            f"directory or delete it")
    (sweep_dir / "runs").mkdir(parents=True, exist_ok=True)
    R.write_yaml(spec_path, spec_dict)
    entries = []
    for entry, cfg in planned:
        run_dir = sweep_dir / "runs" / entry.name
        run_dir.mkdir(exist_ok=True)
        cfg = dataclasses.replace(cfg, out=str(run_dir))
        if not (run_dir / "config.yaml").exists():
            R.write_yaml(run_dir / "config.yaml", C.to_dict(cfg))
        st = R.read_status(run_dir)
        entry.state = "finished" if st and st.get("state") == "finished" else "pending"
        entries.append(entry)
    _write_index(sweep_dir, entries)
    todo = [e for e in entries if e.state != "finished"]
    dirs = {e.name: str(sweep_dir / "runs" / e.name) for e in todo}
    runner = _local if backend == "local" else _ray
    n = workers or max(1, os.cpu_count() or 1)

    def done(name: str, res: dict[str, Any]) -> None:
        e = next(x for x in entries if x.name == name)
        e.state, e.error, e.wall_s = res["state"], res.get("error"), res.get("wall_s")
        _write_index(sweep_dir, entries)
        if on_done is not None:
            on_done(e)

    runner(dirs, n, done)
    return SweepResult(sweep_dir, entries)


def _local(dirs: dict[str, str], workers: int, done: Callable[[str, dict], None]) -> None:
    from concurrent.futures import ThreadPoolExecutor, as_completed

    # threads only wait on the worker subprocesses; each run is its own process
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(run_one, d): name for name, d in dirs.items()}
        for f in as_completed(futures):
            done(futures[f], f.result())


def _ray(dirs: dict[str, str], workers: int, done: Callable[[str, dict], None]) -> None:
    try:
        import ray
    except ImportError:
        raise C.ConfigError("backend='ray' needs the ray extra: pip install 'klppo[ray]'") \
            from None
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS"), include_dashboard=False,
                 log_to_driver=False, ignore_reinit_error=True)
    remote = ray.remote(num_cpus=1)(run_one)
    pending = {remote.remote(d): name for name, d in dirs.items()}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            name = pending.pop(ref)
            try:
                res = ray.get(ref)
            except Exception as e:  # noqa: BLE001 - a lost worker is one failed run
                res = {"state": "failed", "error": repr(e)}
            done(name, res)


#: The KLip-PPO four-way comparison on CartPole (what `make demo` runs).
DEMO_SPEC = SweepSpec(
    preset="klip/cartpole",
    conditions={
        "clip": {"objective": "clip"},
        "per_sample_kl": {"objective": "per_sample_kl"},
        "kl_fixed": {"objective": "kl_penalty", "kl": {"controller": "fixed", "beta": 1.0}},
        "kl_adaptive": {"objective": "kl_penalty",
                        "kl": {"controller": "step", "preset": "klip", "target": 0.02}},
    },
    seeds=[0, 1, 2],
)
