"""The checks of a training config that its fields' own ranges cannot say: choices, relations
between fields, the controller's and actuators' options, W&B names. :func:`validate` runs them
all once, early, and raises :class:`~klppo.runs.errors.ConfigError` naming the field and value.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, get_args

from klppo.core.controllers import (
    CONTROLLERS,
    is_fixed_fallback,
    make_controller,
    proportional_zeroing_steps,
)
from klppo.core.loss import OBJECTIVES
from klppo.core.mismatch import bounds_problem
from klppo.core.surrogates import SHAPES, SOFT_SHAPES
from klppo.rl import bounds
from klppo.rl.actuate import check_actuator
from klppo.rl.band_control import check_band_controller
from klppo.rl.config import (
    Cadence,
    KLMeasure,
    TrainConfig,
    WandbConfig,
    is_multiagent,
)
from klppo.runs.configfile import check_fields
from klppo.runs.errors import ConfigError
from klppo.runs.ranges import check_ranges
from klppo.runs.typecheck import short_repr

__all__ = ["validate"]


def _bad(field_name: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"{field_name}={short_repr(value)}: {why}")


def validate(cfg: TrainConfig) -> TrainConfig:
    """Check every field once, early; raise :class:`ConfigError` naming the field and value."""
    if not isinstance(cfg, TrainConfig):
        raise ConfigError(f"config={short_repr(cfg)}: must be a klppo.rl.TrainConfig (e.g. "
                          f"klppo.rl.preset('klip/cartpole'); a mapping: "
                          f"klppo.rl.config.from_dict(...))")
    # every field of its annotated type (a config built in code too), as a config file's; the
    # objective's domain is the registry (a contributor's registered objective too), checked
    # below, and env_kwargs are the env's own, checked as plain data by bounds.check
    check_fields(cfg, skip=("objective", "env_kwargs"))
    if not isinstance(cfg.objective, str) or cfg.objective not in OBJECTIVES:
        raise _bad("objective", cfg.objective, f"must be one of {sorted(OBJECTIVES)}")
    check_ranges(cfg)  # the ranges in the fields' metadata
    bounds.check(cfg)
    _validate_choices(cfg)
    _validate_numbers(cfg)
    _validate_kl(cfg)
    _validate_wandb(cfg.wandb)
    if cfg.eval_every and is_multiagent(cfg.env):
        raise _bad("eval_every", cfg.eval_every, "evaluation during training is for "
                   "single-agent runs (a multi-agent run: klppo eval after it)")
    return cfg


#: characters W&B refuses in a project, entity or group name
_WANDB_BAD = set("/\\#?%:")


def _validate_wandb(w: WandbConfig) -> None:
    """Names W&B would refuse, refused before the run (a name of 1-128 characters without
    / \\ # ? % :, tags of 1-64 characters)."""
    for name in ("project", "entity", "group"):
        value = getattr(w, name)
        if value is not None and (not 0 < len(value.strip()) <= 128 or _WANDB_BAD & set(value)):
            raise _bad(f"wandb.{name}", value, "must be 1-128 characters, none of / \\ # ? % :")
    for tag in w.tags:
        if not 0 < len(tag.strip()) <= 64:
            raise _bad("wandb.tags", tag, "each tag must be 1-64 characters")


def _validate_choices(cfg: TrainConfig) -> None:
    p = cfg.ppo
    if p.shape not in SHAPES:
        raise _bad("ppo.shape", p.shape, f"must be one of {list(SHAPES)}")
    if p.shape in SOFT_SHAPES and p.softness is None:
        raise _bad("ppo.softness", None, f"shape {p.shape!r} needs a softness > 0")
    if cfg.batch_size % p.minibatch_size:
        raise _bad("ppo.minibatch_size", p.minibatch_size,
                   f"must divide the rollout size num_envs * num_steps = {cfg.batch_size}")
    if cfg.total_steps < cfg.batch_size:
        raise _bad("total_steps", cfg.total_steps,
                   f"is less than one rollout (num_envs * num_steps = {cfg.batch_size})")


def _validate_numbers(cfg: TrainConfig) -> None:
    """What a field's own range cannot say: relations between fields."""
    p = cfg.ppo
    knobs = OBJECTIVES[cfg.objective].knobs
    if "cov_low" in knobs:
        lo = knobs["cov_low"] if p.cov_low is None else p.cov_low
        hi = knobs["cov_high"] if p.cov_high is None else p.cov_high
        assert lo is not None and hi is not None  # the objective's defaults are numbers
        if not lo < hi:
            raise _bad("ppo.cov_low", lo, f"must be below ppo.cov_high={hi}")
    if cfg.objective == "dppo_tv" and p.delta is not None and p.delta > 1:
        raise _bad("ppo.delta", p.delta, "dppo_tv bounds a total-variation distance, a "
                   "probability difference: it must be in (0, 1]")
    if p.early_stop != "none" and p.target_kl is None:
        raise _bad("ppo.early_stop", p.early_stop, "needs ppo.target_kl")
    _validate_entropy(p)
    _validate_staleness(cfg)
    _validate_anneal_from(cfg)
    r = cfg.rollout
    if r.env_backend == "envpool" and (r.vectorization != "auto" or ":" in cfg.env
                                       or cfg.env_kwargs):
        raise _bad("rollout.env_backend", r.env_backend, "runs EnvPool's own tasks, vectorised "
                   "by EnvPool: no rollout.vectorization, env_kwargs, MODULE:ID or pettingzoo "
                   "env")
    if cfg.envpool_threads != 1 and r.env_backend != "envpool":
        raise _bad("envpool_threads", cfg.envpool_threads, "only rollout.env_backend envpool "
                   "reads it")


def _validate_entropy(p: Any) -> None:
    """The entropy controller's settings: read only with ``ppo.ent_target``, a start inside its
    bounds (a start of 0 would switch the bonus's gradient off)."""
    if p.ent_target is None:
        for name, default in (("ent_controller", "proportional"), ("ent_coef_min", 1e-5),
                              ("ent_coef_max", 0.1)):
            if getattr(p, name) != default:
                raise _bad(f"ppo.{name}", getattr(p, name), "only ppo.ent_target reads it")
        return
    if not (math.isfinite(p.ent_target) and p.ent_target > 0):
        raise _bad("ppo.ent_target", p.ent_target, "must be a finite entropy > 0 (nats)")
    if not p.ent_coef_min < p.ent_coef_max:
        raise _bad("ppo.ent_coef_max", p.ent_coef_max, f"must be > ppo.ent_coef_min="
                   f"{p.ent_coef_min}")
    if not p.ent_coef_min <= p.ent_coef <= p.ent_coef_max:
        raise _bad("ppo.ent_coef", p.ent_coef, f"must start in [ppo.ent_coef_min, "
                   f"ppo.ent_coef_max] = [{p.ent_coef_min}, {p.ent_coef_max}] with ppo.ent_target")
    if p.ent_controller not in CONTROLLERS:
        raise _bad("ppo.ent_controller", p.ent_controller, f"must be one of {sorted(CONTROLLERS)}")


def _validate_staleness(cfg: TrainConfig) -> None:
    """A correction only where a rollout is stale (else its policy is the proximal one and
    every weight is 1), bounds only where the correction reads them, and a policy whose
    parameters are apart from the critic's (a stale rollout swaps the policy's alone)."""
    p = cfg.ppo
    if not p.staleness:
        for name, default in (("mismatch_correction", "none"), ("mismatch_upper", None),
                              ("mismatch_lower", None), ("mismatch_reject", None)):
            if getattr(p, name) != default:
                raise _bad(f"ppo.{name}", getattr(p, name), "only ppo.staleness > 0 reads it "
                           "(a fresh rollout's policy is the proximal one)")
        return
    bad = bounds_problem(p.mismatch_correction, p.mismatch_upper, p.mismatch_lower,
                         p.mismatch_reject)
    if bad is not None:
        raise _bad(f"ppo.mismatch_{bad[0]}", bad[1], bad[2])
    if OBJECTIVES[cfg.objective].ratio_to_sampler and p.mismatch_correction != "none":
        raise _bad("ppo.mismatch_correction", p.mismatch_correction, f"objective="
                   f"{cfg.objective!r} takes its ratio to the sampling policy already")
    if OBJECTIVES[cfg.objective].ratio_to_sampler and p.early_stop != "none":
        raise _bad("ppo.early_stop", p.early_stop, f"objective={cfg.objective!r} with "
                   f"ppo.staleness would measure its KL from the policy {p.staleness} updates "
                   f"back (its ratio's), not from the one before the update")
    if cfg.net.shared_trunk:
        raise _bad("ppo.staleness", p.staleness, "needs net.shared_trunk false (a stale "
                   "rollout acts with an old policy and the current critic)")


def _validate_anneal_from(cfg: TrainConfig) -> None:
    a = cfg.lr_anneal_from
    if a is None:
        return
    if not cfg.ppo.anneal_lr:
        raise _bad("lr_anneal_from", a, "applies only with ppo.anneal_lr")
    if len(a) != 2 or a[0] != int(a[0]) or not 1 <= a[0] < cfg.num_iterations \
            or not 0 < a[1] <= 1:
        raise _bad("lr_anneal_from", a, f"must be [iteration k, fraction f] with k a whole "
                   f"number in [1, {cfg.num_iterations}) and f in (0, 1]")


def _validate_kl(cfg: TrainConfig) -> None:
    k = cfg.kl
    if k.controller not in CONTROLLERS:
        raise _bad("kl.controller", k.controller, f"must be one of {sorted(CONTROLLERS)}")
    if not (k.monitor_high > 1 and 0 < k.monitor_low < 1 and k.monitor_patience >= 1):
        raise _bad("kl.monitor_high/low/patience", (k.monitor_high, k.monitor_low,
                   k.monitor_patience), "need high > 1, 0 < low < 1 and patience >= 1")
    for name, value, allowed in (("kl.cadence", k.cadence, get_args(Cadence)),
                                 ("kl.measure", k.measure, get_args(KLMeasure))):
        if value not in allowed:
            raise _bad(name, value, f"must be one of {list(allowed)}")
    check_actuator(cfg)  # before the controller's timing: it names what an actuator ignores
    check_band_controller(cfg)
    if k.measure == "rollout" and k.cadence != "iteration":
        raise _bad("kl.measure", k.measure, "the rollout KL exists once per iteration: "
                   "use kl.cadence iteration")
    if k.measure == "epoch_mean" and k.cadence == "minibatch":
        raise _bad("kl.measure", k.measure, "an epoch mean needs kl.cadence epoch or iteration")
    if cfg.objective == "r2vpo" and k.measure == "rollout" and not (
            k.controller == "fixed" or is_fixed_fallback(k.controller, k.controller_options())):
        raise _bad("kl.measure", k.measure, "r2vpo's multiplier follows the ratio variance its "
                   "penalty measures, and the rollout KL is a KL: use kl.measure "
                   "last_minibatch (any cadence) or epoch_mean (cadence epoch or iteration), "
                   "or kl.controller fixed")
    if cfg.net.separate_losses and not cfg.net.shared_trunk:
        raise _bad("net.separate_losses", True, "only applies with net.shared_trunk")
    try:  # the controller validates its own options (names the bad one)
        make_controller(k.controller, **k.controller_options())
    except ValueError as e:
        raise ConfigError(_controller_error(k, str(e))) from None
    _check_proportional_step(cfg)


def _controller_error(k: Any, message: str) -> str:
    """A controller's refusal of an option (``Owner: NAME must ..., got NAME=VALUE``) as the
    config field's (``kl.NAME=VALUE: must ... (Owner)``) when NAME is a field of ``kl``."""
    m = re.fullmatch(r"(\w+): (\w+) (must .*), got \2=(\S+)", message)
    if m is None or m.group(2) not in {f.name for f in dataclasses.fields(k)}:
        return f"kl: {message}"
    return f"kl.{m.group(2)}={m.group(4)}: {m.group(3)} ({m.group(1)})"


def _check_proportional_step(cfg: TrainConfig) -> None:
    """The proportional rule's samples per update (a minibatch at minibatch cadence, else the
    batch) below the count at which one update under target takes beta to 0
    (:func:`~klppo.core.controllers.proportional_zeroing_steps`)."""
    k = cfg.kl
    if k.controller != "proportional":
        return
    n = cfg.ppo.minibatch_size if k.cadence == "minibatch" else cfg.batch_size
    if n >= proportional_zeroing_steps(k.horizon):
        clip = 1.0 / proportional_zeroing_steps(1.0)  # the rule's clip
        horizon = clip * proportional_zeroing_steps(k.horizon)  # the one in force
        raise _bad("kl.horizon", horizon, f"must exceed {n} x {clip:g} = {n * clip:g} samples: "
                   f"one update of {n} samples (kl.cadence {k.cadence}) below target would "
                   "take beta to 0")
