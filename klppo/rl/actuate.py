"""The lr and clip actuators in the update loop: what the measured KL drives besides beta.

``kl.actuator`` picks what the KL drives: ``beta`` (the controller; the default, unchanged),
``lr`` (the optimiser's learning rate) or ``clip`` (the clip radius ``ppo.eps``). For the last two
an :class:`Actuation` feeds the core's step rule (:mod:`klppo.core.actuators`, ``kl.actuator_rule``)
one KL per minibatch, at the rule's timing, and applies the value before the next step:

* ``rsl_rl`` (``before_step``): the mean analytic KL(old || current) of the minibatch measured
  before its step; the new value is that step's;
* ``rl_games`` (``after_step``): the step's own forward-pass KL; the new value applies from the
  next step (across epochs and iterations).

The learning rate the lr actuator sets *replaces* the linear schedule (``ppo.lr`` is its start and
``ppo.anneal_lr`` must be off); the clip actuator leaves the schedule alone. The rule's state (the
current value) is part of the checkpoint, so a resumed run goes on with the lr it had (rsl_rl
#221 restarts from the configured one). :func:`check_actuator` refuses combinations that would
not do what they say, in one line.
"""

from __future__ import annotations

from typing import Any

import torch

from klppo.core.actuators import ACTUATOR_RULES, CLIP_BOUNDS, KLStepRule, make_actuator_rule
from klppo.core.loss import OBJECTIVES, PPOLoss
from klppo.nn.step import StepResult
from klppo.runs.errors import ConfigError
from klppo.runs.typecheck import short_repr

__all__ = ["ACTUATORS", "Actuation", "check_actuator"]

#: the values of ``kl.actuator``
ACTUATORS = ("beta", "lr", "clip")


def _bad(name: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"{name}={short_repr(value)}: {why}")


def check_actuator(cfg: Any) -> None:
    """Refuse an actuator setting that is unknown, ignored or at odds with another field."""
    k, p = cfg.kl, cfg.ppo
    if k.actuator not in ACTUATORS:
        raise _bad("kl.actuator", k.actuator, f"must be one of {list(ACTUATORS)}")
    if k.actuator_rule not in ACTUATOR_RULES:
        raise _bad("kl.actuator_rule", k.actuator_rule, f"must be one of {sorted(ACTUATOR_RULES)}")
    if k.actuator == "beta":
        for name, value, default in (("kl.actuator_rule", k.actuator_rule, "rsl_rl"),
                                     ("kl.actuator_min", k.actuator_min, None),
                                     ("kl.actuator_max", k.actuator_max, None)):
            if value != default:
                raise _bad(name, value, "only the lr and clip actuators read it (set "
                                        "kl.actuator lr or clip)")
        return
    _check_exclusive(cfg)
    field, value = ("ppo.lr", p.lr) if k.actuator == "lr" else ("ppo.eps", p.eps)
    lo, hi = ACTUATOR_RULES[k.actuator_rule].default_bounds if k.actuator == "lr" else CLIP_BOUNDS
    lo = lo if k.actuator_min is None else k.actuator_min
    hi = hi if k.actuator_max is None else k.actuator_max
    if lo >= hi:
        raise _bad("kl.actuator_min", lo, f"must be below kl.actuator_max ({hi:g})")
    if not lo <= value <= hi:
        raise _bad(field, value, f"kl.actuator={k.actuator} keeps it in [{lo:g}, {hi:g}] "
                                 f"(kl.actuator_min/max): start inside")
    try:
        make_actuator_rule(k.actuator_rule, k.actuator, value, k.target, lo, hi)
    except ValueError as e:
        raise ConfigError(f"kl.actuator={k.actuator}: {e}") from None


def _check_exclusive(cfg: Any) -> None:
    """One thing driven per run, a schedule that is not silently replaced, a band to move."""
    k, p = cfg.kl, cfg.ppo
    what = f"with kl.actuator={k.actuator}"
    if k.controller != "fixed":
        raise _bad("kl.controller", k.controller, f"{what} the KL drives the "
                   f"{'learning rate' if k.actuator == 'lr' else 'clip radius'}; a beta "
                   f"controller would act on the same KL (keep kl.controller fixed)")
    for name, value, default in (("kl.cadence", k.cadence, "iteration"),
                                 ("kl.measure", k.measure, "rollout")):
        if value != default:
            raise _bad(name, value, f"sets the beta controller's timing; {what} the actuator "
                                    f"acts every minibatch at kl.actuator_rule's timing")
    if k.actuator == "lr" and p.anneal_lr:
        raise _bad("ppo.anneal_lr", True, "kl.actuator=lr sets the learning rate from the KL "
                   "(ppo.lr is its start), which replaces the linear schedule: add "
                   "--ppo.no-anneal-lr")
    if k.actuator == "clip":
        objective = OBJECTIVES.get(cfg.objective)
        if objective is not None and not objective.band_knobs:
            raise _bad("kl.actuator", "clip", f"objective={cfg.objective!r} has no clip band "
                       f"to drive (an objective with one: clip, per_sample_kl, clip_kl, ...)")
        for name, value in (("ppo.eps_low", p.eps_low), ("ppo.eps_high", p.eps_high)):
            if value is not None:
                raise _bad(name, value, "kl.actuator=clip moves the symmetric radius ppo.eps; "
                                        "unset the asymmetric edges")


class Actuation:
    """Feeds an lr or clip rule the minibatch KL at the rule's timing and applies its value to
    the step backend's optimiser (``lr``) or the loss's band (``clip``).

    The update loop calls :meth:`begin` once per update, :meth:`before_step` and
    :meth:`after_step` around every minibatch step.
    """

    def __init__(self, knob: str, rule: KLStepRule, backend: Any, loss: PPOLoss) -> None:
        self.knob, self.rule, self.backend, self.loss = knob, rule, backend, loss
        self.used: list[float] = []
        self.updates = 0
        self.apply()

    @classmethod
    def from_config(cls, cfg: Any, backend: Any, loss: PPOLoss) -> Actuation | None:
        """The actuation ``cfg.kl`` asks for, or None for ``kl.actuator beta``."""
        k = cfg.kl
        if k.actuator == "beta":
            return None
        start = cfg.ppo.lr if k.actuator == "lr" else cfg.ppo.eps
        rule = make_actuator_rule(k.actuator_rule, k.actuator, start, k.target, k.actuator_min,
                                  k.actuator_max)
        return cls(k.actuator, rule, backend, loss)

    @property
    def value(self) -> float:
        """The current lr or eps."""
        return self.rule.value

    def apply(self) -> None:
        """Put the rule's value where it acts."""
        if self.knob == "lr":
            self.backend.set_lr(self.rule.value)
        else:
            self.loss.set_eps(self.rule.value)

    def begin(self) -> None:
        """A new update: forget the previous one's per-step values."""
        self.used, self.updates = [], 0

    def before_step(self, idx: torch.Tensor) -> None:
        """rsl_rl's timing: measure the minibatch's KL now and set the value for its step."""
        if self.rule.timing == "before_step":
            self._update(self.backend.analytic_kl(idx))

    def after_step(self, r: StepResult) -> None:
        """Record the value the step used; rl_games' timing: update from the step's KL."""
        self.used.append(self.rule.value)
        if self.rule.timing == "after_step":
            self._update(r.mean_kl)

    def _update(self, kl: float) -> None:
        self.rule.update(kl)
        self.updates += 1
        self.apply()

    def metrics(self) -> dict[str, float]:
        """``lr`` or ``clip_eps`` now, the target, the last KL fed and the updates done."""
        m = {"lr" if self.knob == "lr" else "clip_eps": self.rule.value,
             "actuator_target": self.rule.target, "actuator_updates": float(self.updates)}
        if self.rule.info is not None:
            m["actuator_kl"] = self.rule.info.observed
        return m

    def state_dict(self) -> dict[str, Any]:
        return self.rule.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the rule and apply its value (the run goes on with the lr / eps it had)."""
        self.rule.load_state_dict(state)
        self.apply()
