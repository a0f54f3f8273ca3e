"""Find and read run directories (and sweeps of them), saying what was skipped and why."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from klppo.report.validate import Skip as _Skip
from klppo.report.validate import read_config, read_records
from klppo.runs.configfile import InputError, parse_yaml, read_text
from klppo.runs.metrics import policies_of
from klppo.runs.protocol import final_return

__all__ = ["Run", "Loaded", "load_runs", "condition_of", "describe_machine", "policy_config",
           "resumes", "run_machines", "merge_commits", "read_metadata"]


@dataclass
class Run:
    path: Path
    config: dict[str, Any]
    metrics: list[dict[str, Any]]
    condition: str
    status: str | None
    notes: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    """the run's metadata.json ({} when missing or unreadable)"""
    policy: str | None = None
    """set on one policy's view of a multi-agent run (:meth:`of_policy`); None otherwise"""
    axes: tuple[str, ...] = ()
    """the grid axes (dotted config fields) of the sweep the run belongs to (its spec.yaml's
    ``grid``); :func:`klppo.report.grid.assign_axes` adds those of runs given on their own"""

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

    @property
    def policies(self) -> list[str]:
        """A multi-agent run's policies (its ``POLICY/kl_rollout`` metrics); [] otherwise."""
        return policies_of(self.metrics)

    def of_policy(self, policy: str) -> Run:
        """One policy of a multi-agent run seen as a single-agent run: its ``policy/`` metrics
        without the prefix beside the shared ones (``global_step``, ``episode_count``, ...),
        and the run's config with that policy's ``marl.overrides``. Path, seed, condition,
        status and metadata are the run's."""
        pre = f"{policy}/"
        metrics = []
        for r in self.metrics:
            m = {k: v for k, v in r.items() if "/" not in k}
            m.update({k[len(pre):]: v for k, v in r.items() if k.startswith(pre)})
            metrics.append(m)
        return dataclasses.replace(self, config=policy_config(self.config, policy),
                                   metrics=metrics, notes=[], policy=policy)


@dataclass
class Loaded:
    runs: list[Run]
    skipped: list[tuple[str, str]]  # (path, reason)


def condition_of(config: dict[str, Any]) -> str:
    """A readable condition label from a run's config (used outside sweeps); a multi-agent
    run's per-policy ``marl.overrides`` follow it in parentheses."""
    obj = config.get("objective", "?")
    kl = config.get("kl", {}) or {}
    ppo = config.get("ppo", {}) or {}
    if obj in ("kl_penalty", "clip_kl"):
        label = f"{obj}[{kl.get('controller', 'fixed')}]"
    elif obj == "per_sample_kl" and ppo.get("shape", "clip") != "clip":
        label = f"per_sample_kl[{ppo.get('shape')}]"
    else:
        label = str(obj)
    overrides = _overrides(config)
    return f"{label} ({'; '.join(overrides)})" if overrides else label


def _overrides(config: dict[str, Any]) -> list[str]:
    marl = config.get("marl") or {}
    items = marl.get("overrides") if isinstance(marl, dict) else None
    return [str(x) for x in items] if isinstance(items, list) else []


def policy_config(config: dict[str, Any], policy: str) -> dict[str, Any]:
    """A multi-agent run's config as one policy trains with it: its ``marl.overrides`` items
    ``policy:field=value`` (``kl.target=0.004``; values read as YAML) set over the run's own,
    as the trainer sets them (``klppo.rl.marl.spec.policy_configs``)."""
    out = copy.deepcopy(config)
    for item in _overrides(config):
        where, ok, setting = item.partition(":")
        name, eq, text = setting.partition("=")
        if not ok or not eq or where.strip() != policy or not name.strip():
            continue
        try:
            value = parse_yaml(text.strip(), "marl.overrides") if text.strip() else None
        except InputError:
            value = text.strip()
        node = out
        *parents, leaf = name.strip().split(".")
        for p in parents:
            if not isinstance(node.get(p), dict):
                node[p] = {}
            node = node[p]
        node[leaf] = value
    return out


def _read_state(path: Path) -> str | None:
    try:
        status = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    return status.get("state") if isinstance(status, dict) else None


def read_metadata(path: Path) -> dict[str, Any]:
    """A run's ``metadata.json`` as a dict; ``{}`` when it is missing or unreadable."""
    try:
        meta = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return {}
    return meta if isinstance(meta, dict) else {}


def resumes(meta: dict[str, Any]) -> list[dict[str, Any]]:
    """The resumes a run's metadata.json records (each with its own provenance), oldest
    first; [] for a run never resumed or written before klppo recorded resumes."""
    rs = meta.get("resumes")
    return [r for r in rs if isinstance(r, dict)] if isinstance(rs, list) else []


def run_machines(meta: dict[str, Any]) -> list[str]:
    """Every machine (and software) a run's iterations were computed on: its start and each
    resume, one line each (see :func:`describe_machine`), without repeats."""
    lines = [describe_machine(m) for m in (meta, *resumes(meta))]
    return list(dict.fromkeys(lines))


def merge_commits(lines: list[str]) -> list[str]:
    """Machine lines (:func:`describe_machine`) that differ only in the klppo commit, as one
    line naming the commits (a sweep run from a checkout that moved on records several),
    sorted; a line without a commit (a copy without git) is kept apart only when alone."""
    groups: dict[str, set[str]] = {}
    for line in lines:
        m = re.fullmatch(r"(.*, klppo \S+)(?: \((\w+)\))?", line)
        base, commit = (m.group(1), m.group(2)) if m else (line, None)
        groups.setdefault(base, set())
        if commit:
            groups[base].add(commit)
    out = []
    for base, commits in sorted(groups.items()):
        known = sorted(commits)
        unknown = base in lines  # a run of this machine without a recorded commit
        if not known:
            out.append(base)
        else:
            tail = "; some runs without a recorded commit" if unknown else ""
            out.append(f"{base} ({', '.join(known)}{tail})")
    return out


def describe_machine(meta: dict[str, Any]) -> str:
    """One line naming the machine and software a run was measured on, from its metadata.json
    (``machine`` is recorded since klppo 0.1; older runs give host and platform only)."""
    machine = meta.get("machine")
    m: dict[str, Any] = machine if isinstance(machine, dict) else {}
    parts = []
    if m.get("cpu"):
        parts.append(f"{m['cpu']} CPU" + (f" ({m['cpu_count']} logical cores)"
                                          if m.get("cpu_count") else ""))
    elif m.get("cpu_count"):
        parts.append(f"{m['cpu_count']} logical cores")
    if m:
        parts.append(f"GPU {m['gpu']}" if m.get("gpu") else "no GPU")
    if meta.get("platform"):
        parts.append(str(meta["platform"]))
    if meta.get("python"):
        parts.append(f"Python {meta['python']}")
    packages = meta.get("packages")
    pk: dict[str, Any] = packages if isinstance(packages, dict) else {}
    if pk.get("torch"):
        parts.append(f"torch {pk['torch']}")
    if meta.get("klppo_version"):
        commit = str(meta.get("git_commit") or "")[:10]
        parts.append(f"klppo {meta['klppo_version']}" + (f" ({commit})" if commit else ""))
    return ", ".join(parts) or "not recorded (no metadata.json)"


def _read_run(path: Path, condition: str | None, axes: tuple[str, ...] = ()) -> Run:
    cfg_path, met_path = path / "config.yaml", path / "metrics.jsonl"
    if not cfg_path.exists():
        raise _Skip("no config.yaml: not a klppo run directory")
    if not met_path.exists():
        raise _Skip("no metrics.jsonl: the run never finished an iteration")
    config = read_config(cfg_path)
    usable, bad = read_records(met_path)
    status = _read_state(path / "status.json")
    run = Run(path, config, usable, condition or condition_of(config), status,
              metadata=read_metadata(path / "metadata.json"), axes=axes)
    if bad:
        run.notes.append(f"skipped {bad} malformed line(s) in metrics.jsonl (killed mid-write?)")
    if status not in (None, "finished"):
        run.notes.append(f"run status is {status!r}: its curve is partial")
    started = describe_machine(run.metadata)
    for r in resumes(run.metadata):
        if describe_machine(r) != started:
            run.notes.append(f"resumed at iteration {r.get('iteration')} on another machine or "
                             f"software: {describe_machine(r)}")
    return run


def _load_run(path: Path, condition: str | None,
              axes: tuple[str, ...]) -> tuple[Run | None, str | None]:
    try:
        return _read_run(path, condition, axes), None
    except _Skip as e:
        return None, str(e)
    except (OSError, ValueError) as e:  # unreadable file, bad bytes
        return None, f"unreadable ({type(e).__name__}: {e})"


#: a run to read: its directory, its sweep's condition label and grid axes
_Target = tuple[Path, "str | None", "tuple[str, ...]"]


def sweep_axes(p: Path) -> tuple[str, ...]:
    """The grid axes (dotted fields) of the sweep in ``p``, from its spec.yaml (``()`` when the
    spec is missing or unreadable: the report then infers axes from the runs' configs)."""
    try:
        spec = parse_yaml(read_text(p / "spec.yaml", "spec"), "spec.yaml")
    except (InputError, OSError):
        return ()
    grid = spec.get("grid") if isinstance(spec, dict) else None
    return tuple(str(k) for k in grid) if isinstance(grid, dict) else ()


def _sweep_targets(p: Path, skipped: list[tuple[str, str]]) -> list[_Target]:
    try:
        index = json.loads((p / "index.json").read_bytes())
    except (OSError, ValueError, RecursionError) as e:
        raise _Skip(f"index.json is unreadable ({type(e).__name__}: {e})") from None
    runs = index.get("runs") if isinstance(index, dict) else None
    if not isinstance(runs, list):
        raise _Skip("index.json holds no list of runs")
    targets: list[_Target] = []
    axes = sweep_axes(p)
    for entry in runs:
        name = entry.get("name") if isinstance(entry, dict) else None
        if isinstance(name, str) and name and ("/" in name or "\\" in name or name in (".", "..")
                                               or "\0" in name):
            skipped.append((str(p / "index.json"), f"entry {name!r} is not a run name (a path "
                            f"outside SWEEP/runs/ is never read)"))
        elif isinstance(name, str) and name:
            cond = entry.get("condition")
            targets.append((p / "runs" / entry["name"], None if cond is None else str(cond),
                            axes))
        else:
            skipped.append((str(p / "index.json"), f"entry {entry!r} names no run"))
    return targets


def _targets(p: Path, skipped: list[tuple[str, str]]) -> list[_Target]:
    if not p.exists():
        raise _Skip("does not exist")
    if not p.is_dir():
        raise _Skip("not a directory")
    if (p / "index.json").exists():
        return _sweep_targets(p, skipped)
    if (p / "config.yaml").exists():
        return [(p, None, ())]
    children = sorted(c for c in p.iterdir() if (c / "config.yaml").exists())
    if not children:
        raise _Skip("neither a run directory nor a sweep (no config.yaml or index.json)")
    return [(c, None, ()) for c in children]


def load_runs(paths: list[str | Path], finished_only: bool = False) -> Loaded:
    """Load run directories, sweep directories (``index.json``) and parents of run dirs.

    Nothing unreadable stops the load: each such path is listed in ``skipped`` with the reason.
    ``finished_only``: runs whose status is not ``finished`` (running, interrupted, failed) are
    skipped too, so a sweep still under way reports whole runs only.
    """
    runs: list[Run] = []
    skipped: list[tuple[str, str]] = []
    seen: set[Path] = set()
    for raw in paths:
        p = Path(raw)
        try:
            targets = _targets(p, skipped)
        except _Skip as e:
            skipped.append((str(p), str(e)))
            continue
        except OSError as e:
            skipped.append((str(p), f"unreadable ({type(e).__name__}: {e})"))
            continue
        for path, cond, axes in targets:
            key = path.resolve()
            if key in seen:
                continue
            seen.add(key)
            run, why = _load_run(path, cond, axes)
            if run is not None and finished_only and run.status != "finished":
                why = f"not finished (status {run.status!r}; --finished-only)"
                run = None
            if run is None:
                skipped.append((str(path), why or "unreadable"))
            else:
                runs.append(run)
    return Loaded(runs, skipped)
