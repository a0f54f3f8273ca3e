"""Actuators: step rules by which a measured KL drives a knob other than beta.

The beta controllers (:mod:`klppo.core.controllers`) move a penalty coefficient up when the KL is
high. Robotics PPO moves the *learning rate* instead, down when the KL is high: rsl_rl's
``schedule="adaptive"`` and rl_games' ``AdaptiveScheduler``. klppo applies the same rules to the
learning rate or to the clip radius ``eps``; the rule is pure arithmetic on floats, fed one KL
per minibatch by the training loop (:mod:`klppo.rl.actuate`), which applies the value.

The KL fed to a rule is the analytic KL(pi_old || pi_current), nats per sample (per state, summed
over action dimensions, averaged over the minibatch), in the unit of ``target``.

Each rule updates ``v`` (the lr or eps) from ``d``, the observed KL:

* ``rsl_rl``, before the step: ``d > target * band: v = max(lower, v / factor)``;
  ``elif d < target / band and d > 0: v = min(upper, v * factor)``;
* ``rl_games``, after the step: ``d > band * target: v = max(v / factor, lower)``;
  ``d < target / band: v = min(v * factor, upper)``.

Defaults (``band`` 2, ``factor`` 1.5): rsl_rl ``desired_kl`` 0.01, lr in [1e-5, 1e-2]
(rsl_rl/algorithms/ppo.py); rl_games ``kl_threshold`` 0.008, lr in [1e-6, 1e-2]
(rl_games/common/schedulers.py). For the clip radius klppo uses eps in :data:`CLIP_BOUNDS` (no
peer to follow). ``when`` is the rule's :attr:`KLStepRule.timing`: rsl_rl measures the KL of a
minibatch before its optimiser step and that step already uses the new lr; rl_games (its default
``schedule_type: legacy``) takes the KL from the step's own forward pass and the new lr applies
from the next step.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Literal

from klppo.core.names import RuleName

__all__ = ["ActuatorInfo", "KLStepRule", "RslRlRule", "RlGamesRule", "ACTUATOR_RULES",
           "CLIP_BOUNDS", "Knob", "RuleName", "Timing", "make_actuator_rule"]

Knob = Literal["lr", "clip"]
Timing = Literal["before_step", "after_step"]

#: default bounds of an actuated clip radius eps (klppo's choice; rsl_rl and rl_games adapt the lr)
CLIP_BOUNDS: tuple[float, float] = (0.02, 0.5)


@dataclass(frozen=True)
class ActuatorInfo:
    """What one actuator update saw and did."""

    target: float
    """Target KL, nats per sample."""
    observed: float
    """The KL the rule was fed (same unit)."""
    value_before: float
    value_after: float

    def as_dict(self) -> dict[str, Any]:
        """The fields as a plain dict."""
        return asdict(self)


def _positive(owner: str, name: str, value: float) -> float:
    v = float(value)
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{owner}: {name} must be finite and > 0, got {name}={value!r}")
    return v


class KLStepRule:
    """Base of the multiplicative step rules: holds the value, its bounds and the record.

    Args:
        value: the initial lr or eps (must lie in ``[lower, upper]``).
        target: target KL in nats per sample (None: the rule's default).
        lower, upper: bounds on the value (None: the rule's lr defaults).
        factor: multiplicative step (> 1). band: the dead band's ratio (> 1).
    """

    name: ClassVar[str] = "base"
    timing: ClassVar[Timing] = "before_step"
    default_target: ClassVar[float] = 0.01
    default_bounds: ClassVar[tuple[float, float]] = (1e-5, 1e-2)

    def __init__(self, value: float, target: float | None = None, lower: float | None = None,
                 upper: float | None = None, factor: float = 1.5, band: float = 2.0) -> None:
        cls = type(self).__name__
        self.target = _positive(cls, "target", self.default_target if target is None else target)
        self.lower = _positive(cls, "lower", self.default_bounds[0] if lower is None else lower)
        self.upper = _positive(cls, "upper", self.default_bounds[1] if upper is None else upper)
        if self.lower >= self.upper:
            raise ValueError(f"{cls}: lower must be < upper, got lower={self.lower!r} >= "
                             f"upper={self.upper!r}")
        self.factor = _positive(cls, "factor", factor)
        self.band = _positive(cls, "band", band)
        for name, v in (("factor", self.factor), ("band", self.band)):
            if v <= 1:
                raise ValueError(f"{cls}: {name} must be > 1, got {name}={v!r}")
        v0 = _positive(cls, "value", value)
        if not self.lower <= v0 <= self.upper:
            raise ValueError(f"{cls}: value must lie in [lower, upper] = [{self.lower:g}, "
                             f"{self.upper:g}], got value={value!r}")
        self._value = v0
        self.num_updates = 0
        self.info: ActuatorInfo | None = None

    @property
    def value(self) -> float:
        """The current lr or eps."""
        return self._value

    def update(self, observed_kl: float, n_steps: int = 1) -> float:
        """Feed one KL measurement (nats per sample); return the new value.

        ``n_steps`` is accepted for the controllers' interface (the replay lab) and unused.
        """
        d = float(observed_kl)
        if not math.isfinite(d):
            raise ValueError(f"observed_kl must be finite, got observed_kl={observed_kl!r}")
        before = self._value
        self._value = self._next(d, before)
        self.num_updates += 1
        self.info = ActuatorInfo(self.target, d, before, self._value)
        return self._value

    def _next(self, d: float, v: float) -> float:  # pragma: no cover
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue identically: the value, the update count, the record."""
        return {"name": self.name, "value": self._value, "num_updates": self.num_updates,
                "info": None if self.info is None else self.info.as_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (ValueError for another rule's state)."""
        if state.get("name") != self.name:
            raise ValueError(f"state_dict is for actuator rule {state.get('name')!r}, not "
                             f"{self.name!r}")
        self._value = float(state["value"])
        self.num_updates = int(state["num_updates"])
        self.info = None if state.get("info") is None else ActuatorInfo(**state["info"])

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(value={self._value:.6g}, target={self.target}, "
                f"bounds=[{self.lower:g}, {self.upper:g}])")


class RslRlRule(KLStepRule):
    """rsl_rl's adaptive learning rate (``PPO.update``, ``schedule="adaptive"``): per minibatch,
    before its step, ``d > 2 desired_kl: lr = max(1e-5, lr / 1.5)``; ``elif d < desired_kl / 2 and
    d > 0: lr = min(1e-2, lr * 1.5)``. The comparisons and products are written as rsl_rl writes
    them, so the same KLs give the same floats."""

    name = "rsl_rl"
    timing = "before_step"
    default_target = 0.01
    default_bounds = (1e-5, 1e-2)

    def _next(self, d: float, v: float) -> float:
        if d > self.target * self.band:
            return max(self.lower, v / self.factor)
        if d < self.target / self.band and d > 0.0:
            return min(self.upper, v * self.factor)
        return v


class RlGamesRule(KLStepRule):
    """rl_games' ``AdaptiveScheduler.update``: ``kl > 2 kl_threshold: lr = max(lr / 1.5,
    min_lr)``; ``kl < 0.5 kl_threshold: lr = min(lr * 1.5, max_lr)`` (two ``if``s, no guard at
    0); with ``schedule_type: legacy`` once per minibatch, after its step. ``target / band`` is
    ``0.5 * target`` exactly for band 2."""

    name = "rl_games"
    timing = "after_step"
    default_target = 0.008
    default_bounds = (1e-6, 1e-2)

    def _next(self, d: float, v: float) -> float:
        out = v
        if d > self.band * self.target:
            out = max(v / self.factor, self.lower)
        if d < self.target / self.band:
            out = min(v * self.factor, self.upper)
        return out


#: rule name -> class; :func:`make_actuator_rule` is the only dispatch on rule names.
ACTUATOR_RULES: dict[str, type[KLStepRule]] = {c.name: c for c in (RslRlRule, RlGamesRule)}


def make_actuator_rule(rule: str, knob: str, value: float, target: float | None = None,
                       lower: float | None = None, upper: float | None = None) -> KLStepRule:
    """The rule called ``rule`` acting on ``knob`` (``lr`` or ``clip``) from ``value``.

    Bounds left None are the rule's lr defaults for ``lr`` and :data:`CLIP_BOUNDS` for ``clip``.
    ValueError names a bad rule, knob or option.
    """
    try:
        cls = ACTUATOR_RULES[rule]
    except (KeyError, TypeError):
        raise ValueError(f"actuator rule must be one of {sorted(ACTUATOR_RULES)}, got "
                         f"rule={rule!r}") from None
    if knob == "clip":
        lower = CLIP_BOUNDS[0] if lower is None else lower
        upper = CLIP_BOUNDS[1] if upper is None else upper
    elif knob != "lr":
        raise ValueError(f"actuator knob must be lr or clip, got knob={knob!r}")
    return cls(value, target=target, lower=lower, upper=upper)
