"""Tuning specs: the search space of ``klppo tune``, read from YAML like a sweep spec and
checked before any directory is made.

A spec is a base preset, ``base`` overrides, a ``space`` of config fields to search, the
``seeds`` each trial runs (its value is the mean of their final returns), the number of
``trials``, the ``sampler`` (TPE by default), the ``pruner`` (the median rule by default) and
the trials before either starts to learn (``startup_trials``). A field of the space is one of::

    ppo.lr: {low: 1.0e-5, high: 1.0e-2, log: true}    # a float (log-uniform)
    ppo.update_epochs: {low: 2, high: 20}              # an integer (both bounds integers)
    ppo.eps: {low: 0.1, high: 0.3, step: 0.05}         # a float on a grid
    objective: {choices: [clip, per_sample_kl]}        # one of a list

Every problem is one :class:`~klppo.rl.config.ConfigError` line naming the key and the value
(``space.ppo.lr.low=-1: ...``); each bound and each choice is checked as a value of its config
field over the base, so a space cannot name a field that does not exist or a value it refuses.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from klppo.experiments.sweep_spec import (
    RESERVED,
    _bad,
    _check_overrides,
    _check_seeds,
    _dotted,
    _overlay,
    check_spec_keys,
)
from klppo.rl import config as C
from klppo.rl.config_checks import validate
from klppo.rl.presets import preset
from klppo.runs.configfile import InputError, merge_nested, parse_yaml, read_text
from klppo.runs.typecheck import short_repr

__all__ = ["TuneSpec", "Param", "load_tune_spec", "SAMPLERS", "PRUNERS", "MAX_TRIALS"]

SAMPLERS = ("tpe", "random")
PRUNERS = ("median", "none")
#: the most trials a study runs (a typo should not start a million runs)
MAX_TRIALS = 10_000


def _number(x: Any) -> TypeGuard[int | float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class Param:
    """One field of the search space: a float or int range (``log``, ``step``) or choices."""

    name: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple[Any, ...] = ()

    @property
    def kind(self) -> str:
        if self.choices:
            return "categorical"
        return "int" if isinstance(self.low, int) and isinstance(self.high, int) else "float"

    @classmethod
    def parse(cls, name: str, d: Any) -> Param:
        """A space entry (``{low, high, log?, step?}`` or ``{choices}``), its shape checked."""
        where = f"space.{name}"
        if not isinstance(d, dict):
            raise _bad(where, d, "must be {low: A, high: B} (log: true, step: S optional) or "
                                 "{choices: [...]}")
        unknown = set(d) - {"low", "high", "log", "step", "choices"}
        if unknown:
            raise _bad(f"{where}.{sorted(unknown)[0]}", d[sorted(unknown)[0]],
                       "unknown key; known: low, high, log, step, choices")
        if "choices" in d:
            return cls._categorical(where, name, d)
        return cls._range(where, name, d)

    @classmethod
    def _categorical(cls, where: str, name: str, d: dict[str, Any]) -> Param:
        choices = d["choices"]
        if set(d) != {"choices"}:
            raise _bad(where, d, "choices take no low, high, log or step")
        if not isinstance(choices, list) or not choices:
            raise _bad(f"{where}.choices", choices, "must be a non-empty list")
        for c in choices:
            if not (c is None or isinstance(c, (bool, int, float, str))):
                raise _bad(f"{where}.choices", c, "a choice must be a number, a string, "
                                                  "true/false or null (Optuna stores them)")
        if len({repr(c) for c in choices}) != len(choices):
            raise _bad(f"{where}.choices", choices, "a choice is given twice")
        return cls(name, choices=tuple(choices))

    @classmethod
    def _range(cls, where: str, name: str, d: dict[str, Any]) -> Param:
        low, high, log, step = d.get("low"), d.get("high"), d.get("log", False), d.get("step")
        if not _number(low):
            raise _bad(f"{where}.low", low, "must be a finite number")
        if not _number(high):
            raise _bad(f"{where}.high", high, "must be a finite number")
        if not high > low:
            raise _bad(f"{where}.high", high, f"must be greater than low={low!r}")
        if not isinstance(log, bool):
            raise _bad(f"{where}.log", log, "must be true or false")
        if log and low <= 0:
            raise _bad(f"{where}.low", low, "must be > 0 on a log scale")
        if step is not None:
            if not _number(step) or step <= 0:
                raise _bad(f"{where}.step", step, "must be a number > 0")
            if log:
                raise _bad(f"{where}.step", step, "a log scale takes no step")
            if isinstance(low, int) and isinstance(high, int) and not isinstance(step, int):
                raise _bad(f"{where}.step", step, "an integer range takes an integer step")
        return cls(name, low=low, high=high, log=log, step=step)

    def values_to_check(self) -> list[Any]:
        """The values that must each be valid for the field: the bounds, or every choice."""
        return list(self.choices) if self.choices else [self.low, self.high]

    def grid(self, most: int = 2000) -> list[Any]:
        """Values the sampler can draw, to check before the study: every choice, every value of
        an integer or stepped range (at most ``most`` of them, evenly spread), or ``most``
        evenly spread points of a continuous one."""
        if self.choices:
            return list(self.choices)
        lo, hi = self.low, self.high
        assert lo is not None and hi is not None  # (a range)
        if self.kind == "int" or self.step is not None:
            step = self.step or 1
            n = int((hi - lo) // step) + 1
            ks = range(n) if n <= most else [round(i * (n - 1) / (most - 1)) for i in range(most)]
            return [lo + k * step for k in ks]
        if self.log:
            ratio = (hi / lo) ** (1 / (most - 1))
            return [lo * ratio ** i for i in range(most - 1)] + [hi]
        return [lo + (hi - lo) * i / (most - 1) for i in range(most)]

    def suggest(self, trial: Any) -> Any:
        """Optuna's suggestion for this field on ``trial``."""
        if self.choices:
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high),  # type: ignore
                                     step=int(self.step or 1), log=self.log)
        return trial.suggest_float(self.name, float(self.low), float(self.high),  # type: ignore
                                   step=self.step, log=self.log)


@dataclass
class TuneSpec:
    """What to tune: a base config, a search space, seeds per trial, the budget and the
    sampler and pruner."""

    preset: str | None = "klip/cartpole"
    """base preset (None: TrainConfig defaults)"""
    base: dict[str, Any] = field(default_factory=dict)
    """overrides applied to every trial (nested or dotted keys, e.g. {"total_steps": 50000})"""
    space: dict[str, Any] = field(default_factory=dict)
    """dotted field -> {low, high, log?, step?} or {choices}"""
    seeds: list[int] = field(default_factory=lambda: [0])
    """seeds every trial runs, one run directory each; its value is their mean final return"""
    trials: int = 20
    """trials of the study in all (a rerun with more continues it)"""
    sampler: str = "tpe"
    """tpe (Optuna's TPESampler) or random"""
    pruner: str = "median"
    """median (stop a trial whose final-return estimate is below the median of earlier trials
    at the same step) or none"""
    startup_trials: int = 5
    """trials before TPE models the space and before the pruner prunes"""
    sampler_seed: int = 0
    """seed of the sampler"""

    @classmethod
    def from_dict(cls, d: Any) -> TuneSpec:
        check_spec_keys(cls, d, "tuning spec")
        return cls(**d).check()

    def params(self) -> list[Param]:
        return [Param.parse(name, d) for name, d in self.space.items()]

    def check(self) -> TuneSpec:
        """Check the spec's shape and every value against the config (no environment made)."""
        if self.preset is not None and not isinstance(self.preset, str):
            raise _bad("preset", self.preset, "must be a preset name or null")
        _check_overrides("base", self.base)
        if not isinstance(self.space, dict) or not self.space:
            raise _bad("space", self.space, "must be a non-empty mapping of dotted field -> "
                                            "{low, high} or {choices}")
        for name in self.space:
            if not isinstance(name, str) or not name or name.split(".")[0] in RESERVED:
                why = (f"a tuning study sets {name} itself" if isinstance(name, str)
                       and name.split(".")[0] in RESERVED else "must be a dotted field name")
                raise _bad("space", name, why)
        _check_seeds(self.seeds)
        for key, allowed in (("sampler", SAMPLERS), ("pruner", PRUNERS)):
            if getattr(self, key) not in allowed:
                raise _bad(key, getattr(self, key), f"must be one of {', '.join(allowed)}")
        for key, low, high in (("trials", 1, MAX_TRIALS), ("startup_trials", 0, MAX_TRIALS),
                               ("sampler_seed", 0, 2**32 - 1)):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
                raise _bad(key, v, f"must be an integer in [{low}, {high:,}]")
        self._check_values()
        return self

    def base_config(self) -> C.TrainConfig:
        cfg = preset(self.preset) if self.preset else C.TrainConfig()
        return _overlay("base", _dotted("base", self.base), cfg)

    def _check_values(self) -> None:
        base = self.base_config()
        params = self.params()
        for p in params:
            for v in p.values_to_check():
                _overlay(f"space.{p.name}={v!r}", _dotted("space", {p.name: v}), base,
                         check=True)
        validate(base)

    def invalid_draws(self) -> list[str]:
        """One line per field of the space some of whose values the config refuses (with the
        others at the base's values): how many of the values checked, one example and why.
        Draws of such values become ``invalid`` trials; a field none of whose values is valid
        is a ConfigError (the study could train nothing)."""
        base, notes = self.base_config(), []
        for p in self.params():
            bad: list[tuple[Any, str]] = []
            grid = p.grid()
            for v in grid:
                try:
                    _overlay(f"space.{p.name}={v!r}", _dotted("space", {p.name: v}), base,
                             check=True)
                except C.ConfigError as e:
                    bad.append((v, str(e)))
            if len(bad) == len(grid):
                raise C.ConfigError(f"space.{p.name}: none of the {len(grid):,} values checked "
                                    f"is valid, e.g. {bad[0][1]}")
            if bad:
                notes.append(f"space.{p.name}: {len(bad):,} of the {len(grid):,} values checked "
                             f"are invalid (e.g. {bad[0][1]}); their draws become invalid "
                             f"trials")
        return notes

    def config(self, values: dict[str, Any], seed: int, out: str) -> C.TrainConfig:
        """The validated config of one run of a trial: the base, the trial's values, the seed
        and the run directory."""
        over = merge_nested(_dotted("trial", values), {"seed": seed, "out": out})
        return _overlay("trial", over, self.base_config(), check=True)

    def identity(self) -> dict[str, Any]:
        """What a tuning directory must keep across reruns (all but the trial budget)."""
        d = dataclasses.asdict(self)
        d.pop("trials")
        return d


def load_tune_spec(path: str | Path) -> TuneSpec:
    """Read and check a tuning spec YAML file (the loader of config files)."""
    where = f"spec={str(path)!r}"
    try:
        d = parse_yaml(read_text(path, "spec"), where)
    except InputError as e:
        raise C.ConfigError(str(e)) from None
    keys = [f.name for f in dataclasses.fields(TuneSpec)]
    if not isinstance(d, dict):
        raise C.ConfigError(f"{where}: holds {short_repr(d, 40)}; expected a mapping with "
                            f"keys {keys}")
    return TuneSpec.from_dict(d)
