"""Sweep specs: what a sweep runs, read from YAML or built in Python, checked before any run.

A spec is a base preset, ``base`` overrides, named ``conditions``, a ``grid`` over any config
field and ``seeds``. :func:`expand` turns it into one validated training config per run; every
problem is a :class:`~klppo.rl.config.ConfigError` whose one-line message starts with
``field=value:`` (``base.ppo.lr='fast': ...``, ``seeds=0: ...``, ``spec='x.yaml': ...``).
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from klppo.rl import config as C
from klppo.rl.config_checks import validate
from klppo.rl.presets import preset
from klppo.runs.configfile import InputError, merge_nested, parse_yaml, read_text
from klppo.runs.typecheck import short_repr

__all__ = ["SweepSpec", "RunPlan", "load_spec", "expand", "count_runs", "MAX_RUNS", "RESERVED",
           "DEMO_SPEC"]


def _bad(name: str, value: Any, why: str) -> C.ConfigError:
    return C.ConfigError(f"{name}={short_repr(value)}: {why}")


def check_spec_keys(cls: Any, d: Any, what: str) -> None:
    """``d`` is a mapping whose keys are fields of the spec dataclass ``cls`` (``what`` names
    the spec in the one-line refusal)."""
    known = [f.name for f in dataclasses.fields(cls)]
    if not isinstance(d, dict):
        raise _bad("spec", d, f"must be a mapping with keys {known}")
    for key in d:
        if key not in known:
            raise _bad(str(key), d[key], f"unknown {what} key; known: {known}")


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
    """seeds run for every condition (distinct integers >= 0)"""

    @classmethod
    def from_dict(cls, d: Any) -> SweepSpec:
        check_spec_keys(cls, d, "sweep spec")
        spec = cls(**d)
        spec.check()
        return spec

    def check(self) -> SweepSpec:
        """Check the spec's shape (types, seeds); :func:`expand` checks the values."""
        if self.preset is not None and not isinstance(self.preset, str):
            raise _bad("preset", self.preset, "must be a preset name or null")
        _check_overrides("base", self.base)
        if not isinstance(self.conditions, dict):
            raise _bad("conditions", self.conditions,
                       "must be a mapping of condition name -> overrides")
        for name, over in self.conditions.items():
            if not isinstance(name, str) or not name.strip():
                raise _bad("conditions", name, "a condition name must be a non-empty string")
            if len(name) > 64 or any(c in name for c in "/\\\0") or not name.isprintable():
                raise _bad("conditions", name, "a condition name names run directories: at "
                           "most 64 printable characters, no '/', '\\' or NUL")
            _check_overrides(f"conditions.{name}", over)
        if not isinstance(self.grid, dict):
            raise _bad("grid", self.grid, "must be a mapping of dotted field -> list of values")
        for key, values in self.grid.items():
            if not isinstance(key, str) or not key:
                raise _bad("grid", key, "a grid axis must be a dotted field name")
            if not isinstance(values, list) or not values:
                raise _bad(f"grid.{key}", values, "must be a non-empty list of values")
            _check_key("grid", key, values)
        _check_seeds(self.seeds)
        return self


#: config fields a sweep sets itself for every run: an override of them would be ignored
RESERVED = {"seed": "seeds are the spec's `seeds:` list (each run is named by its seed)",
            "out": "each run's directory is SWEEP_DIR/runs/NAME",
            "runs_root": "each run's directory is SWEEP_DIR/runs/NAME"}
#: the most runs a sweep starts unless asked for more (``max_runs``, ``--max-runs``)
MAX_RUNS = 10_000


def _check_key(name: str, key: Any, value: Any) -> None:
    if not isinstance(key, str) or not key:
        raise _bad(name, key, "field names must be non-empty strings")
    head = key.split(".")[0].replace("-", "_")
    if head in RESERVED:
        raise _bad(f"{name}.{key}", value, f"a sweep sets {head} itself: {RESERVED[head]}")


def _check_overrides(name: str, over: Any) -> None:
    if over is None:
        return
    if not isinstance(over, dict):
        raise _bad(name, over, "must be a mapping of field -> value")
    for key, value in over.items():
        _check_key(name, key, value)


def count_runs(spec: SweepSpec) -> int:
    """How many runs the spec asks for (conditions x grid points x seeds)."""
    n = max(1, len(spec.conditions)) * len(spec.seeds)
    for values in spec.grid.values():
        n *= len(values)
    return n


def _check_seeds(seeds: Any) -> None:
    why = "must be a non-empty list of distinct integers >= 0"
    if not isinstance(seeds, list) or not seeds:
        raise _bad("seeds", seeds, why)
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise _bad("seeds", seeds, f"{why} ({s!r} is not)")
    if len(set(seeds)) != len(seeds):
        raise _bad("seeds", seeds, f"{why} (a seed is repeated)")


def load_spec(path: str | Path) -> SweepSpec:
    """Read and check a sweep spec YAML file (the loader of config files: YAML 1.2 numbers, a
    duplicate key or an alias bomb refused)."""
    where = f"spec={str(path)!r}"
    try:
        d = parse_yaml(read_text(path, "spec"), where)
    except InputError as e:
        raise C.ConfigError(str(e)) from None
    keys = [f.name for f in dataclasses.fields(SweepSpec)]
    if d is None:
        raise C.ConfigError(f"{where}: is empty; expected a mapping with keys {keys}")
    if not isinstance(d, dict):
        raise C.ConfigError(f"{where}: holds a {type(d).__name__}; expected a mapping with "
                            f"keys {keys}")
    return SweepSpec.from_dict(d)


# ------------------------------------------------------------------------------ expansion
def _dotted(name: str, d: dict[str, Any] | None) -> dict[str, Any]:
    """{"a.b": 1} -> {"a": {"b": 1}}, merging nested dicts; ``name`` labels errors."""
    out: dict[str, Any] = {}
    for key, value in (d or {}).items():
        node = out
        parts = key.split(".")
        for i, p in enumerate(parts[:-1]):
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise _bad(f"{name}.{key}", value,
                           f"conflicts with {'.'.join(parts[:i + 1])}={node!r}")
        _set_once(f"{name}.{key}", node, parts[-1], value)
    return out


def _set_once(where: str, node: dict[str, Any], key: str, value: Any) -> None:
    """node[key] = value, merging mappings; a field set twice (``ppo.lr`` and ``ppo: {lr}``)
    is refused instead of the last one winning."""
    if key not in node:
        node[key] = value
    elif isinstance(value, dict) and isinstance(node[key], dict):
        for k, v in value.items():
            _set_once(f"{where}.{k}", node[key], k, v)
    else:
        raise _bad(where, value, f"is given twice (also {node[key]!r}); give each field once")


def _overlay(where: str, d: dict[str, Any], base: C.TrainConfig,
             check: bool = False) -> C.TrainConfig:
    """``C.from_dict`` (+ ``validate``) with every error as one ConfigError naming ``where``."""
    try:
        cfg = C.from_dict(d, base)
        return validate(cfg) if check else cfg
    except C.ConfigError as e:
        raise C.ConfigError(f"{where}.{e}" if not check else f"{e} ({where})") from None
    except (TypeError, ValueError, AttributeError) as e:  # a type the config code let through
        raise C.ConfigError(f"{where}: {e}") from None


@dataclass
class RunPlan:
    """One planned run of a sweep."""

    name: str
    condition: str
    seed: int
    overrides: dict[str, Any]
    config: C.TrainConfig


def _safe(text: str) -> str:
    return text.replace("/", "-").replace(":", "-")


def expand(spec: SweepSpec, max_runs: int = MAX_RUNS) -> list[RunPlan]:
    """Every (condition x grid point x seed) as a run with its validated config; more than
    ``max_runs`` runs is refused (a typo in a grid should not start 100,000 runs)."""
    spec.check()
    n = count_runs(spec)
    if n > max_runs:
        raise _bad("runs", n, f"the spec asks for {n:,} runs (conditions x grid x seeds), more "
                   f"than {max_runs:,}; pass --max-runs {n} if that is meant")
    base_cfg = preset(spec.preset) if spec.preset else C.TrainConfig()
    base_cfg = _overlay("base", _dotted("base", spec.base), base_cfg)
    conditions = {n: _dotted(f"conditions.{n}", o) for n, o in spec.conditions.items()}
    for cname, over in conditions.items():
        _overlay(f"conditions.{cname}", over, base_cfg)
    for key, values in spec.grid.items():
        labels = [str(v) for v in values]
        if len(set(labels)) != len(labels):
            dup = next(v for v in labels if labels.count(v) > 1)
            raise _bad(f"grid.{key}", values, f"the value {dup} is given twice")
        for v in values:
            _overlay("grid", _dotted("grid", {key: v}), base_cfg)
    keys = list(spec.grid)
    points = list(itertools.product(*(spec.grid[k] for k in keys))) or [()]
    out = []
    for cname, cover in (conditions or {"base": {}}).items():
        for point in points:
            label = cname + "".join(f"__{k.split('.')[-1]}={v}" for k, v in zip(keys, point)
                                    if k != "env")  # the env already leads the run name
            overrides = merge_nested(cover, _dotted("grid", dict(zip(keys, point))))
            for seed in spec.seeds:
                cfg = _overlay(f"condition {label}, seed {seed}", {**overrides, "seed": seed},
                               base_cfg, check=True)
                name = _safe(f"{cfg.env}__{label}__{seed}")
                out.append(RunPlan(name, label, seed, overrides, cfg))
    names = [r.name for r in out]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise _bad("conditions", sorted(spec.conditions),
                   f"two runs get the same name {dup!r}; make condition names unique")
    return out


def check_envs(plans: list[RunPlan]) -> None:
    """Every environment of the sweep can be trained (its extra installed, spaces klppo
    handles), checked once per env; a sweep calls it before it makes any directory (planning
    with :func:`expand` alone needs no environment installed)."""
    from klppo.core.objectives import OBJECTIVES
    from klppo.rl.envs import check_env
    from klppo.rl.marl.spec import check_multiagent, is_multiagent

    seen: set[str] = set()
    for plan in plans:  # an env once (twice if some objective needs discrete actions)
        c = plan.config
        cls = OBJECTIVES.get(c.objective)
        key = repr((c.env, sorted(c.env_kwargs.items()), c.marl.env_kwargs,
                    bool(cls and cls.needs_probabilities), c.rollout.env_backend))
        if key in seen:
            continue
        seen.add(key)
        try:
            if is_multiagent(plan.config.env):
                check_multiagent(plan.config)
            else:
                check_env(c.env, c.env_kwargs, c.objective, c.rollout.env_backend)
        except ValueError as e:  # EnvError, ConfigError: one line naming the env
            raise C.ConfigError(f"condition {plan.condition}: {e}") from None


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
