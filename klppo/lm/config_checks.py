"""Every check of an :class:`~klppo.lm.config.RLHFConfig` (:func:`validate_rlhf`): types and
ranges, the settings' relations, the objective's knobs, the mismatch correction's bounds, the
reward and the device; each refusal a :class:`~klppo.runs.errors.ConfigError` naming the field
and its value."""

from __future__ import annotations

import math
from typing import Any

from klppo.core.controllers import proportional_zeroing_steps
from klppo.core.mismatch import bounds_problem
from klppo.core.objective_base import BAND_KNOBS, KNOB_NAMES, Knobs
from klppo.lm.config import RLHFConfig
from klppo.runs.configfile import field_hints, overlay
from klppo.runs.device import resolve_device
from klppo.runs.errors import ConfigError
from klppo.runs.ranges import check_ranges
from klppo.runs.typecheck import TypeCheckError, check_value

__all__ = ["validate_rlhf", "config_from_dict", "objective_knobs"]


def _bad(field: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"{field}={value!r}: {why}")


def validate_rlhf(c: RLHFConfig) -> RLHFConfig:
    """Check every field's type and range once, early; :class:`ConfigError` names the first
    bad field and its value."""
    for name, ann in field_hints(RLHFConfig).items():
        try:
            check_value(name, getattr(c, name), ann)
        except TypeCheckError as e:
            raise ConfigError(str(e)) from None
    check_ranges(c)  # the ranges in the fields' metadata
    from klppo.lm.bounds import check_rlhf

    check_rlhf(c)
    if c.out is not None and (not c.out.strip() or "\0" in c.out):
        raise _bad("out", c.out, "names no path (leave it out for a new directory under "
                   "runs/rlhf)")
    if c.batch_size % c.minibatch_size:
        raise _bad("minibatch_size", c.minibatch_size, f"must divide batch_size={c.batch_size}")
    if not c.beta_max > c.beta_min or math.isnan(c.beta_max):
        raise _bad("beta_max", c.beta_max, f"must be > beta_min={c.beta_min}")
    if not c.beta_min <= c.beta <= c.beta_max:
        raise _bad("beta", c.beta, f"must be in [beta_min, beta_max] = [{c.beta_min}, "
                                   f"{c.beta_max}]")
    if c.target is None and c.controller != "proportional" and c.controller != "fixed":
        raise _bad("target", None, f"controller {c.controller!r} needs a target")
    _check_horizon(c)
    if not (c.monitor_high > 1 and 0 < c.monitor_low < 1 and c.monitor_patience >= 1):
        raise _bad("monitor_high/low/patience", (c.monitor_high, c.monitor_low,
                   c.monitor_patience), "need high > 1, 0 < low < 1 and patience >= 1")
    if c.ref_reset_mix != 1.0 and c.ref_reset_every is None and c.ref_reset_kl is None:
        raise _bad("ref_reset_mix", c.ref_reset_mix, "only a reference reset (ref_reset_every "
                   "or ref_reset_kl) reads it")
    if c.hold and c.target is None:
        raise _bad("hold", c.hold, "holds beta until the KL reaches the target: set a target")
    if c.hold_limit is not None and not c.hold:
        raise _bad("hold_limit", c.hold_limit, "bounds a hold: set hold")
    for gain in ("kp", "ki", "kd"):
        if getattr(c, gain) is not None and c.controller != "pid":
            raise _bad(gain, getattr(c, gain), "a gain of the pid controller: set controller=pid")
    _check_mismatch(c)
    if c.kl_loss is not None and c.kl_placement != "loss":
        raise _bad("kl_loss", c.kl_loss, "only kl_placement=loss reads it")
    _check_objective(c)
    _check_reward(c.reward)
    _check_device(c.device)
    return c


def _check_horizon(c: RLHFConfig) -> None:
    """An explicit proportional horizon under which one update of batch_size episodes below
    target takes beta to 0 (:func:`~klppo.core.controllers.proportional_zeroing_steps`)."""
    if c.controller != "proportional" or c.horizon is None:
        return
    if c.batch_size >= proportional_zeroing_steps(c.horizon):
        clip = c.horizon / proportional_zeroing_steps(c.horizon)  # the rule's clip
        raise _bad("horizon", c.horizon, f"must exceed batch_size x {clip:g} = "
                   f"{clip * c.batch_size:g} episodes: one update of {c.batch_size} episodes "
                   "below target would take beta to 0")


def objective_knobs(c: RLHFConfig) -> Knobs:
    """The objective's own settings from the config."""
    return Knobs(**{k: getattr(c, k) for k in KNOB_NAMES})


def _check_mismatch(c: RLHFConfig) -> None:
    """Bounds only where a correction reads them; a correction needs temperature 1 (else the
    ratio would hold the temperature as well as the precision)."""
    bad = bounds_problem(c.mismatch_correction, c.mismatch_upper, c.mismatch_lower,
                         c.mismatch_reject)
    if bad is not None:
        raise _bad(f"mismatch_{bad[0]}", bad[1], bad[2])
    if c.mismatch_correction == "none":
        return
    if not c.staleness and c.rollout_dtype == "float32":
        raise _bad("mismatch_correction", c.mismatch_correction, "needs a sampler that differs "
                   "from the policy trained (staleness > 0 or rollout_dtype bfloat16 / float16):"
                   " with neither every weight is 1")
    if c.temperature != 1.0:
        raise _bad("mismatch_correction", c.mismatch_correction, f"needs temperature 1 (got "
                   f"{c.temperature}): the sampler's ratio would also hold the temperature")


def _check_objective(c: RLHFConfig) -> None:
    """An objective that needs a controller's beta, and settings the objective would ignore,
    are refused."""
    from klppo.core.objectives import OBJECTIVES, Band, make_objective
    from klppo.core.sequence_objectives import SequenceObjective

    cls = OBJECTIVES[c.objective]
    if c.cov_selection != "top" and c.objective != "clip_cov":
        raise _bad("cov_selection", c.cov_selection, f"objective={c.objective!r} would ignore "
                   "it (clip_cov only)")
    if cls.ratio_to_sampler and c.mismatch_correction != "none":
        raise _bad("mismatch_correction", c.mismatch_correction, f"objective={c.objective!r} "
                   "takes its ratio to the sampling policy already")
    if cls.ratio_to_sampler and c.temperature != 1.0 and (c.staleness or
                                                          c.rollout_dtype != "float32"):
        raise _bad("temperature", c.temperature, f"objective={c.objective!r} with a separate "
                   "sampler needs temperature 1: its ratio would also hold the temperature")
    if c.loss_reduction != "token_mean" and issubclass(cls, SequenceObjective):
        raise _bad("loss_reduction", c.loss_reduction, f"objective={c.objective!r} already "
                   "reduces each response first")
    if cls.uses_beta:
        raise _bad("objective", c.objective, "its beta would be the reference KL's (kl_placement "
                   "prices that); use kl_placement loss for a KL term in the loss")
    for name in (*BAND_KNOBS[:2], *KNOB_NAMES):
        value = getattr(c, name)
        if value is not None and name not in cls.band_knobs and name not in cls.knobs:
            raise _bad(name, value, f"objective={c.objective!r} would ignore it")
    try:
        make_objective(c.objective, Band(c.eps, c.eps_low, c.eps_high), knobs=objective_knobs(c))
    except ValueError as e:
        raise ConfigError(f"objective={c.objective!r}: {e}") from None


def _check_device(name: str) -> None:
    try:
        resolve_device(name)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _check_reward(spec: str) -> None:
    if spec == "vader":
        return
    name, _, rest = spec.partition(":")
    path, _, label = rest.partition(":")
    if name != "classifier" or not path:
        raise _bad("reward", spec, "must be 'vader' or 'classifier:PATH[:LABEL]'")
    if label and not label.isdigit():
        raise _bad("reward", spec, f"LABEL {label!r} must be a non-negative integer")


def config_from_dict(values: Any, base: RLHFConfig | None = None,
                     what: str = "config") -> RLHFConfig:
    """``base`` (default: the defaults) with the fields of a mapping read from YAML, each
    checked against its type; then :func:`validate_rlhf`."""
    if not isinstance(values, dict):
        raise ConfigError(f"{what}={values!r}: must be a mapping of field: value")
    try:
        cfg = overlay(base if base is not None else RLHFConfig(), values)
    except TypeCheckError as e:
        raise ConfigError(str(e)) from None
    return validate_rlhf(cfg)
