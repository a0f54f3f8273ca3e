"""Grid axes: the config fields a sweep varies on top of its conditions (``--grid ppo.lr=...``).

A sweep's ``spec.yaml`` names its grid axes (:func:`klppo.report.load.load_runs` reads them).
Runs given on their own (no sweep) have axes too where the report would otherwise mix them: when
two runs share env, condition label and seed (and policy), the fields whose values differ
between them become axes of that env (:func:`assign_axes`), and the condition labels gain
``__leaf=value`` as a sweep's do.

Each run is then at a *grid point* (its values of its env's axes) and has a *base condition*
(its condition without the grid suffix): the learning curves are faceted by grid point and
coloured by base condition, and the aggregates and tables key on both.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

from klppo.report.load import Run

__all__ = ["BOOKKEEPING", "flat_config", "value_at", "settings", "grid_point", "point_label",
           "base_condition", "assign_axes"]

#: config fields that say where and how a run is recorded, not what it computes
BOOKKEEPING = frozenset({"out", "runs_root", "checkpoint_every", "track", "tensorboard"})


class _List(tuple):
    """A config list as a hashable value that still prints as the list (``[]``, ``['a']``),
    as a sweep's condition labels show it."""

    def __repr__(self) -> str:
        return repr(list(self))

    __str__ = __repr__


def _hashable(v: Any) -> Any:
    if isinstance(v, list):
        return _List(_hashable(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((str(k), _hashable(x)) for k, x in v.items()))
    return v


def flat_config(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as ``{"ppo.lr": 0.001, ...}`` (lists become tuples)."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flat_config(v, key + "."))
        else:
            out[key] = _hashable(v)
    return out


def value_at(config: dict[str, Any], dotted: str) -> Any:
    """The value of a dotted field in a nested config (None where absent)."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return _hashable(node)


def settings(run: Run, leave_out: frozenset[str] = frozenset()) -> dict[str, Any]:
    """What a run computes: its flat config without the bookkeeping fields (where it writes,
    how it logs), ``wandb*`` fields, and ``leave_out``."""
    return {k: v for k, v in flat_config(run.config).items()
            if k not in BOOKKEEPING and k not in leave_out
            and not k.split(".")[0].startswith("wandb")}


def grid_point(run: Run) -> tuple[tuple[str, Any], ...]:
    """``((axis, value), ...)`` of the run's grid axes (the env, a table column of its own, is
    left out)."""
    return tuple((a, value_at(run.config, a)) for a in run.axes if a != "env")


def shown(condition: str) -> str:
    """A condition as tables and figures show it: ``clip__lr=0.0003`` -> ``clip, lr=0.0003``
    (the ``__`` in run directory names is for the file system; CSV files keep the name)."""
    return condition.replace("__", ", ")


def point_label(point: tuple[tuple[str, Any], ...]) -> str:
    """``"ppo.lr=0.001, kl.target=0.02"``; ``""`` for no axis."""
    return ", ".join(f"{a}={v}" for a, v in point)


def _suffix(point: tuple[tuple[str, Any], ...]) -> str:
    """The grid part of a sweep's condition label (as ``klppo sweep`` names conditions)."""
    return "".join(f"__{a.split('.')[-1]}={v}" for a, v in point)


def base_condition(run: Run) -> str:
    """The condition without its grid suffix (``clip__lr=0.001`` -> ``clip``)."""
    base = run.condition
    for point in reversed(grid_point(run)):
        part = _suffix((point,))
        if base.endswith(part) and len(base) > len(part):
            base = base[:-len(part)]
    return base


def assign_axes(runs: list[Run]) -> list[Run]:
    """The runs with their env's grid axes: a sweep's own (from its spec), and the fields that
    differ between runs of one env, condition, seed and policy (runs given on their own). A run
    that gains an axis its condition label does not name gets ``__leaf=value`` appended."""
    same: dict[tuple, list[Run]] = defaultdict(list)
    for r in runs:
        same[(r.env, r.condition, r.seed, r.policy)].append(r)
    extra: dict[str, set[str]] = defaultdict(set)
    for (env, *_), group in same.items():
        if len(group) < 2:
            continue
        flats = [settings(r, frozenset({"seed"})) for r in group]
        keys = set().union(*flats)
        extra[env] |= {k for k in keys if len({f.get(k) for f in flats}) > 1}
    by_env: dict[str, set[str]] = defaultdict(set)
    for r in runs:
        by_env[r.env] |= set(r.axes)
    out = []
    for r in runs:
        axes = tuple(dict.fromkeys([*r.axes, *sorted(by_env[r.env] - set(r.axes)),
                                    *sorted(extra[r.env] - by_env[r.env])]))
        added = [a for a in axes if a not in r.axes and a != "env"]
        cond = r.condition
        if added and not r.axes:
            cond += _suffix(tuple((a, value_at(r.config, a)) for a in added))
        out.append(dataclasses.replace(r, axes=axes, condition=cond) if axes != r.axes else r)
    return out
