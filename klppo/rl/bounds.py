"""Bounds on a training config beyond its fields' own ranges: every float finite, sizes that fit
in memory, output paths that name a directory, env keyword arguments that are plain data, and
multi-agent settings only where they apply.

Called by :func:`klppo.rl.config_checks.validate`; every problem is a
:class:`~klppo.rl.config.ConfigError` naming the field and the value. The bounds and why are in
docs/reliability.md.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from klppo.core.loss import OBJECTIVES
from klppo.core.objective_base import KNOB_NAMES
from klppo.rl.config import MarlConfig, is_multiagent
from klppo.runs.errors import ConfigError
from klppo.runs.typecheck import short_repr

__all__ = ["check", "MAX_NUM_ENVS", "MAX_ROLLOUT", "MAX_LAYER", "MAX_HIDDEN_WEIGHTS",
           "MAX_TOTAL_STEPS", "MAX_TORCH_THREADS", "MAX_UPDATE_EPOCHS"]

MAX_NUM_ENVS = 1024
"""environments of one run (each is a live env object in this process)"""
MAX_ROLLOUT = 2**21
"""samples per rollout, num_envs * num_steps (the largest preset uses 16,384)"""
MAX_LAYER = 16_384
"""units of one hidden layer"""
MAX_HIDDEN_WEIGHTS = 2**25
"""weights between the hidden layers of one network (128 MiB of float32)"""
MAX_TOTAL_STEPS = 10**12
MAX_TORCH_THREADS = 1024
MAX_UPDATE_EPOCHS = 10_000
"""passes over one rollout (the presets use 10; 10^9 ran without end)"""


def _bad(name: str, value: Any, why: str) -> ValueError:
    return ConfigError(f"{name}={short_repr(value)}: {why}")


def check(cfg: Any) -> None:
    """Raise ConfigError for the first value out of these bounds."""
    _check_finite(cfg, "")
    _check_sizes(cfg)
    _check_paths(cfg)
    _check_marl(cfg)
    _check_env_kwargs(cfg)
    _check_applies(cfg)


def _check_finite(obj: Any, prefix: str) -> None:
    """Every float anywhere in the config is finite (a NaN would surface as a broken run)."""
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v):
            _check_finite(v, f"{prefix}{f.name}.")
        elif isinstance(v, float) and not math.isfinite(v):
            raise _bad(prefix + f.name, v, "must be a finite number")


def _check_sizes(cfg: Any) -> None:
    r, hidden = cfg.rollout, cfg.net.hidden
    for name, v, top in (("rollout.num_envs", r.num_envs, MAX_NUM_ENVS),
                         ("rollout.num_steps", r.num_steps, MAX_ROLLOUT),
                         ("total_steps", cfg.total_steps, MAX_TOTAL_STEPS),
                         ("torch_threads", cfg.torch_threads, MAX_TORCH_THREADS),
                         ("envpool_threads", cfg.envpool_threads, MAX_TORCH_THREADS),
                         ("ppo.update_epochs", cfg.ppo.update_epochs, MAX_UPDATE_EPOCHS)):
        if v > top:
            raise _bad(name, v, f"must be at most {top:,}")
    if cfg.batch_size > MAX_ROLLOUT:
        raise _bad("rollout.num_envs * rollout.num_steps", cfg.batch_size,
                   f"a rollout may hold at most {MAX_ROLLOUT:,} samples")
    if any(h < 1 or h > MAX_LAYER for h in hidden):
        raise _bad("net.hidden", hidden, f"layer sizes must be in [1, {MAX_LAYER:,}]")
    weights = sum(a * b for a, b in zip(hidden, hidden[1:]))
    if weights > MAX_HIDDEN_WEIGHTS:
        raise _bad("net.hidden", hidden, f"{weights:,} weights between hidden layers; at most "
                   f"{MAX_HIDDEN_WEIGHTS:,}")


def _check_paths(cfg: Any) -> None:
    for name, v in (("out", cfg.out), ("runs_root", cfg.runs_root)):
        if v is not None and (not v.strip() or "\0" in v):
            unset = " (or unset, for a default name)" if name == "out" else ""
            raise _bad(name, v, f"must name a directory{unset}")


def _check_marl(cfg: Any) -> None:
    """Multi-agent settings on a single-agent env would be ignored: refused instead."""
    if is_multiagent(cfg.env):
        return
    default = MarlConfig()
    for f in dataclasses.fields(default):
        if getattr(cfg.marl, f.name) != getattr(default, f.name):
            raise _bad(f"marl.{f.name}", getattr(cfg.marl, f.name),
                       f"multi-agent settings apply only to a pettingzoo:MODULE env, not "
                       f"env={cfg.env!r}")


#: what an env keyword argument may hold: what a YAML or JSON config can write back
_PLAIN = (str, int, float, bool, type(None))


def _plain(value: Any, depth: int = 0) -> bool:
    if isinstance(value, _PLAIN):
        return True
    if depth > 20:
        return False
    if isinstance(value, (list, tuple)):
        return all(_plain(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v, depth + 1) for k, v in value.items())
    return False


def _check_env_kwargs(cfg: Any) -> None:
    """``env_kwargs``: a mapping of names to plain data (the run's config.yaml records it),
    for a single-agent env (a PettingZoo env takes ``marl.env_kwargs``)."""
    kw = cfg.env_kwargs
    if not isinstance(kw, dict) or not all(isinstance(k, str) and k.isidentifier() for k in kw):
        raise _bad("env_kwargs", kw, "must be a mapping of names to values")
    if not kw:
        return
    if is_multiagent(cfg.env):
        raise _bad("env_kwargs", kw, "a pettingzoo:MODULE env takes its arguments as "
                   "marl.env_kwargs key=value")
    for k, v in kw.items():
        if not _plain(v):
            raise _bad(f"env_kwargs.{k}", v, "must be plain data (a string, number, bool, "
                       "null, list or mapping), as a config file writes it")
    steps = kw.get("max_episode_steps")
    if steps is not None and not (isinstance(steps, int) and not isinstance(steps, bool)
                                  and 1 <= steps <= MAX_TOTAL_STEPS):
        raise _bad("env_kwargs.max_episode_steps", steps, f"gym.make's time limit: an integer "
                   f"1 to {MAX_TOTAL_STEPS:,} (null: the env's own)")
    if kw.get("render_mode") is not None:
        raise _bad("env_kwargs.render_mode", kw["render_mode"], "training never renders (klppo "
                   "eval --video records a trained policy)")


def _check_applies(cfg: Any) -> None:
    """A setting the chosen objective never reads would be ignored: refused instead."""
    objective, p = OBJECTIVES.get(cfg.objective), cfg.ppo
    if objective is None:
        return  # an unknown objective is refused by the config's own checks
    if objective.level == "sequence" and not getattr(objective, "one_step", False):
        raise _bad("objective", cfg.objective, "is sequence-level (it needs the tokens of "
                   "whole sequences): only the language-model loop runs it (klppo rlhf)")
    if not objective.shaped:
        for name, value, default in (("ppo.shape", p.shape, "clip"),
                                     ("ppo.softness", p.softness, None)):
            if value != default:
                raise _bad(name, value, f"only per_sample_kl follows a beta_t shape; "
                           f"objective={cfg.objective!r} would ignore it")
    for name in ("dual_clip", "eps_low", "eps_high"):
        value = getattr(p, name)
        if value is not None and name not in objective.band_knobs:
            why = "has no clip band" if not objective.band_knobs else f"does not read {name}"
            raise _bad(f"ppo.{name}", value, f"objective={cfg.objective!r} {why}, so it would "
                       f"ignore it")
    for name in KNOB_NAMES:
        value = getattr(p, name)
        if value is not None and name not in objective.knobs:
            readers = [n for n, c in OBJECTIVES.items() if name in c.knobs]
            raise _bad(f"ppo.{name}", value, f"objective={cfg.objective!r} would ignore it "
                       f"(read by {', '.join(readers)})")
    if p.target_kl is not None and p.early_stop == "none":
        raise _bad("ppo.target_kl", p.target_kl, "only the KL early stop reads it: set "
                   "ppo.early_stop minibatch or epoch (a controller's target is kl.target)")
    if not objective.uses_beta and cfg.kl.controller != "fixed":
        raise _bad("kl.controller", cfg.kl.controller, f"objective={cfg.objective!r} uses no "
                   f"beta, so no controller would act: set kl.controller fixed too, or a beta "
                   f"objective (kl_penalty, clip_kl, ...)")
