"""Beta controllers: the scalar KL coefficient of PPO-KL and of RLHF's KL penalty.

A controller is a Lagrange multiplier on the constraint ``KL <= target``: when the observed KL is
above the target it raises beta (the penalty bites harder), below it lowers beta. It is a plain
object with no torch state; the trainer calls :meth:`KLController.update` at one named point
(per minibatch, per epoch or per iteration) and logs :attr:`KLController.info`. It never updates
itself inside a loss.

The observed KL passed to ``update`` must be in the same unit as ``target`` (per-sample mean for
RL trust regions, per-sequence sum or per-token mean for RLHF); the controller cannot check this,
so every caller names the unit.

The rules (``d`` = the observed KL):

* ``fixed``: beta constant;
* ``step``: ``d > hi_band * target: beta *= increase``; ``d < target / lo_band: beta *=
  decrease``;
* ``proportional``: ``e = clip(d / target - 1, -clip, clip)``; ``beta *= 1 + e * n_steps /
  horizon``;
* ``exponential``: ``beta *= exp(gain * (d - target))``;
* ``pid``: ``delta = d - target``; ``I = clamp(I + ki*delta, 0, beta_max)``;
  ``D = max(0, d_s - d_s_prev)``; ``beta = max(0, kp*delta_s + I + kd*D)`` (``delta_s``,
  ``d_s``: optional EMAs of delta and d; beta then clamped as every rule).
"""

from __future__ import annotations

import inspect
import math
from typing import Any

from klppo.core.controller_base import KLController, UpdateInfo, _positive
from klppo.core.names import ControllerName, StepPreset

__all__ = [
    "UpdateInfo",
    "KLController",
    "FixedKL",
    "StepKL",
    "ProportionalKL",
    "proportional_zeroing_steps",
    "run_horizon",
    "ExponentialKL",
    "PIDKL",
    "relative_pid_gains",
    "STEP_PRESETS",
    "is_fixed_fallback",
    "CONTROLLERS",
    "make_controller",
]


class FixedKL(KLController):
    """Constant beta. ``target`` is optional and only used to report the relative error."""

    name = "fixed"
    requires_target = False

    def _next_beta(self, d: float, n_steps: int) -> tuple[float, bool]:
        return self._beta, False


#: Named step-rule presets. ``lo_band``: beta decreases when d < target / lo_band.
STEP_PRESETS: dict[str, dict[str, float]] = {
    # Schulman et al. 2017, section 4: bands 1.5, factors 2 and 1/2, beta0 = 1.
    "ppo_paper": dict(beta=1.0, target=0.01, hi_band=1.5, lo_band=1.5, increase=2.0, decrease=0.5),
    # RLlib PPO: d > 2 target -> *1.5, d < 0.5 target -> *0.5; kl_coeff 0.2, kl_target 0.01.
    "rllib": dict(beta=0.2, target=0.01, hi_band=2.0, lo_band=2.0, increase=1.5, decrease=0.5),
    # TorchRL KLPENPPOLoss: dtarg 0.01, beta 1.0, increment 2, decrement 0.5 (applied every
    # loss call in TorchRL: use the per-minibatch cadence to reproduce it).
    "torchrl": dict(beta=1.0, target=0.01, hi_band=1.5, lo_band=1.5, increase=2.0, decrease=0.5),
    # KLip-PPO adaptive baseline: PPO-paper rule once per rollout on the analytic KL between the
    # rollout policy and the post-update policy, beta clamped to [1e-4, 1e4].
    "klip": dict(
        beta=1.0,
        target=0.02,
        hi_band=1.5,
        lo_band=1.5,
        increase=2.0,
        decrease=0.5,
        beta_min=1e-4,
        beta_max=1e4,
    ),
}


class StepKL(KLController):
    """The PPO-paper step rule: multiply beta by ``increase`` or ``decrease`` outside a band.

    ``d > hi_band * target`` -> ``beta *= increase``; ``d < target / lo_band`` ->
    ``beta *= decrease``; otherwise unchanged. ``preset`` fills defaults from
    :data:`STEP_PRESETS`; explicit arguments override the preset.
    """

    target: float  # this rule needs a target (the base refuses None for it)
    name = "step"

    def __init__(
        self,
        beta: float | None = None,
        target: float | None = None,
        beta_min: float | None = None,
        beta_max: float | None = None,
        hi_band: float | None = None,
        lo_band: float | None = None,
        increase: float | None = None,
        decrease: float | None = None,
        preset: StepPreset | None = "ppo_paper",
        hold: bool = False,
        hold_limit: int | None = None,
    ) -> None:
        if preset is not None and preset not in STEP_PRESETS:
            raise ValueError(
                f"StepKL: preset must be one of {sorted(STEP_PRESETS)}, got preset={preset!r}"
            )
        base = dict(STEP_PRESETS[preset or "ppo_paper"])
        given = dict(
            beta=beta,
            target=target,
            beta_min=beta_min,
            beta_max=beta_max,
            hi_band=hi_band,
            lo_band=lo_band,
            increase=increase,
            decrease=decrease,
        )
        opts = {**base, **{k: v for k, v in given.items() if v is not None}}
        self.preset = preset
        self.hi_band = _positive("StepKL", "hi_band", opts["hi_band"])
        self.lo_band = _positive("StepKL", "lo_band", opts["lo_band"])
        self.increase = float(opts["increase"])
        self.decrease = float(opts["decrease"])
        if not (math.isfinite(self.increase) and self.increase >= 1):
            raise ValueError(f"StepKL: increase must be >= 1, got increase={increase!r}")
        if not (self.decrease > 0 and self.decrease <= 1):
            raise ValueError(f"StepKL: decrease must be in (0, 1], got decrease={decrease!r}")
        super().__init__(
            beta=opts["beta"],
            target=opts["target"],
            beta_min=opts.get("beta_min", 0.0),
            beta_max=opts.get("beta_max", math.inf),
            hold=hold,
            hold_limit=hold_limit,
        )

    def _next_beta(self, d: float, n_steps: int) -> tuple[float, bool]:
        if d > self.hi_band * self.target:
            return self._beta * self.increase, False
        if d < self.target / self.lo_band:
            return self._beta * self.decrease, False
        return self._beta, False


class ProportionalKL(KLController):
    """Ziegler et al. (2019) proportional rule, as in trlx, verl and OpenRLHF.

    ``e = clip(d / target - 1, -clip, clip)``; ``beta *= 1 + e * n_steps / horizon``.
    ``horizon`` is in the unit of ``n_steps`` (samples or episodes): after ``horizon`` steps of
    a constant error e, beta has moved by a factor of about ``exp(e)``.
    Typical settings: trlx's HH example beta 0.05, target 6 (nats per sequence), horizon 10000.
    """

    target: float  # this rule needs a target (the base refuses None for it)
    name = "proportional"

    def __init__(
        self,
        beta: float = 0.2,
        target: float = 6.0,
        beta_min: float = 0.0,
        beta_max: float = math.inf,
        horizon: float = 10000.0,
        clip: float = 0.2,
        hold: bool = False,
        hold_limit: int | None = None,
    ) -> None:
        self.horizon = _positive("ProportionalKL", "horizon", horizon)
        self.clip = _positive("ProportionalKL", "clip", clip)
        super().__init__(beta=beta, target=target, beta_min=beta_min, beta_max=beta_max,
                         hold=hold, hold_limit=hold_limit)

    def _next_beta(self, d: float, n_steps: int) -> tuple[float, bool]:
        raw = d / self.target - 1.0
        e = min(max(raw, -self.clip), self.clip)
        return self._beta * (1.0 + e * n_steps / self.horizon), e != raw


def proportional_zeroing_steps(horizon: float | None = None, clip: float | None = None) -> float:
    """The steps per update (``n_steps``) from which one update of :class:`ProportionalKL` below
    its target can take beta to 0 or below: ``1 + e * n / horizon <= 0`` at ``e = -clip``, so
    ``n >= horizon / clip`` (the rule's own defaults where None). Configs refuse such settings:
    a multiplicative rule at 0 stays there."""
    defaults = inspect.signature(ProportionalKL).parameters
    h = defaults["horizon"].default if horizon is None else horizon
    c = defaults["clip"].default if clip is None else clip
    return h / c


#: :func:`run_horizon`: beta can move by a factor ``e^RUN_HORIZON_LOG_RANGE`` (about 20) at full
#: error within ``RUN_HORIZON_FRACTION`` of a run's updates, and by at most ``1 +
#: RUN_HORIZON_MAX_STEP`` in one update
RUN_HORIZON_LOG_RANGE = 3.0
RUN_HORIZON_FRACTION = 0.25
RUN_HORIZON_MAX_STEP = 0.5


def run_horizon(updates: int, samples_per_update: int, clip: float = 0.2) -> float:
    """A :class:`ProportionalKL` horizon derived from a run's length and batch.

    Ziegler's horizon is in samples (Ziegler et al.'s code: 10000 with 512-sample rollouts, beta
    moves 1% per update at most), sized for runs of thousands of updates. A run of ``updates``
    updates of ``samples_per_update`` samples gets the horizon ``H`` under which
    ``RUN_HORIZON_FRACTION`` of its updates at full error (``clip``) move beta by a factor
    ``e^RUN_HORIZON_LOG_RANGE``:
    ``(1 + clip * n / H) ^ (f * U) = e^L``, so ``n / H = (e^(L / (f U)) - 1) / clip``, capped at
    ``RUN_HORIZON_MAX_STEP / clip`` (beta moves by at most 1.5x, or 0.5x, per update)."""
    u, n = int(updates), int(samples_per_update)
    if u < 1 or n < 1:
        raise ValueError(f"run_horizon: updates and samples_per_update must be >= 1, got "
                         f"updates={updates!r}, samples_per_update={samples_per_update!r}")
    c = _positive("run_horizon", "clip", clip)
    step = math.expm1(RUN_HORIZON_LOG_RANGE / (RUN_HORIZON_FRACTION * u))
    return n * c / min(step, RUN_HORIZON_MAX_STEP)


class ExponentialKL(KLController):
    """``beta *= exp(gain * (d - target))``, clamped to ``[1e-4, 10]`` by default."""

    target: float  # this rule needs a target (the base refuses None for it)
    name = "exponential"

    def __init__(
        self,
        beta: float = 1.0,
        target: float = 0.01,
        beta_min: float = 1e-4,
        beta_max: float = 10.0,
        gain: float = 0.1,
        hold: bool = False,
        hold_limit: int | None = None,
    ) -> None:
        self.gain = _positive("ExponentialKL", "gain", gain)
        super().__init__(beta=beta, target=target, beta_min=beta_min, beta_max=beta_max,
                         hold=hold, hold_limit=hold_limit)

    def _next_beta(self, d: float, n_steps: int) -> tuple[float, bool]:
        x = min(self.gain * (d - self.target), 700.0)  # exp overflow guard; clamped below anyway
        return self._beta * math.exp(x), False


class PIDKL(KLController):
    """PID Lagrangian (Stooke, Achiam & Abbeel 2020) on the constraint ``KL <= target``.

    ``delta = d - target``; ``I = clamp(I + ki * delta, 0, beta_max)`` (anti-windup: the integral
    never goes negative nor beyond what beta can use); ``D = max(0, d_s - d_s_prev)``;
    ``beta = max(0, kp * delta_s + I + kd * D)`` clamped to ``[beta_min, beta_max]``, where
    ``delta_s`` and ``d_s`` are the EMA-smoothed error and KL (``p_ema`` / ``d_ema`` in [0, 1);
    0 means no smoothing). The integral starts at the initial ``beta``, so the first output equals
    ``beta`` when the first KL equals the target. Gains are in beta per nat of KL: scale them with
    the target (an error of 0.01 nats needs ki of order 10-100 to move beta).
    """

    target: float  # this rule needs a target (the base refuses None for it)
    name = "pid"

    def __init__(
        self,
        beta: float = 1.0,
        target: float = 0.01,
        beta_min: float = 0.0,
        beta_max: float = math.inf,
        kp: float = 1.0,
        ki: float = 10.0,
        kd: float = 0.0,
        p_ema: float = 0.0,
        d_ema: float = 0.0,
        hold: bool = False,
        hold_limit: int | None = None,
    ) -> None:
        for gname, g in (("kp", kp), ("ki", ki), ("kd", kd)):
            if not (math.isfinite(float(g)) and float(g) >= 0):
                raise ValueError(f"PIDKL: {gname} must be finite and >= 0, got {gname}={g!r}")
        for ename, e in (("p_ema", p_ema), ("d_ema", d_ema)):
            if not 0 <= float(e) < 1:
                raise ValueError(f"PIDKL: {ename} must be in [0, 1), got {ename}={e!r}")
        self.kp, self.ki, self.kd = float(kp), float(ki), float(kd)
        self.p_ema, self.d_ema = float(p_ema), float(d_ema)
        super().__init__(beta=beta, target=target, beta_min=beta_min, beta_max=beta_max,
                         hold=hold, hold_limit=hold_limit)
        self.integral = self._beta
        self._delta_s: float | None = None
        self._d_s: float | None = None

    def _next_beta(self, d: float, n_steps: int) -> tuple[float, bool]:
        delta = d - self.target
        self.integral = min(max(self.integral + self.ki * delta, 0.0), self.beta_max)
        if self._delta_s is None or self._d_s is None:
            delta_s, d_s, derivative = delta, d, 0.0
        else:
            delta_s = self.p_ema * self._delta_s + (1 - self.p_ema) * delta
            d_s = self.d_ema * self._d_s + (1 - self.d_ema) * d
            derivative = max(0.0, d_s - self._d_s)
        self._delta_s, self._d_s = delta_s, d_s
        return max(0.0, self.kp * delta_s + self.integral + self.kd * derivative), False

    def _extra_state(self) -> dict[str, Any]:
        return {"integral": self.integral, "delta_s": self._delta_s, "d_s": self._d_s}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        values: dict[str, float | None] = {}
        for key in ("integral", "delta_s", "d_s"):
            v = state.get(key)
            optional = key != "integral"
            if (v is None and optional) or (isinstance(v, (int, float)) and
                                             not isinstance(v, bool) and math.isfinite(v)):
                values[key] = None if v is None else float(v)
            else:
                raise ValueError(f"{key}={v!r}: must be a finite number"
                                 + (" or null" if optional else ""))
        integral = values["integral"]
        assert integral is not None  # (checked above: a finite number)
        self.integral = integral
        self._delta_s, self._d_s = values["delta_s"], values["d_s"]


def relative_pid_gains(target: float, kp: float = 1.0, ki: float = 0.15,
                       kd: float = 0.0) -> dict[str, float]:
    """:class:`PIDKL` gains (beta per nat of KL) from gains per *relative* error: ``kp /
    target``, ``ki / target``, ``kd / target``. The defaults are what held SmolLM2-135M at its
    target in TRL's GRPO from a weak and a strong start, 3 seeds each (docs/algorithms.md, "Can
    beta hold the KL?"): an error of 100% of the target moves beta by 1 at once and its integral
    by 0.15 per update; the integral, floored at 0, unwinds a strong start while the KL ramps
    up. A sizeable ``kp`` suits a KL that follows beta within an update or two, as a KL term in
    the loss does; a noisier KL wants a smaller one."""
    t = _positive("relative_pid_gains", "target", target)
    return {"kp": kp / t, "ki": ki / t, "kd": kd / t}


#: name -> class. ``make_controller`` is the only dispatch on controller names.
CONTROLLERS: dict[str, type[KLController]] = {
    c.name: c for c in (FixedKL, StepKL, ProportionalKL, ExponentialKL, PIDKL)
}


def _given(options: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if v is not None}


def is_fixed_fallback(name: str, options: dict[str, Any]) -> bool:
    """True when :func:`make_controller` turns ``proportional`` without a target into a fixed
    beta (trlx's semantics)."""
    return name == "proportional" and options.get("target") is None


def make_controller(name: ControllerName, **options: Any) -> KLController:
    """Build a controller by name: ``fixed``, ``step``, ``proportional``, ``exponential``, ``pid``.

    Common options: ``beta`` (initial value), ``target``, ``beta_min``, ``beta_max``.
    ``step``: ``preset`` (``ppo_paper``, ``rllib``, ``torchrl``, ``klip``) or ``hi_band``,
    ``lo_band``, ``increase``, ``decrease``; ``proportional``: ``horizon``, ``clip``;
    ``exponential``: ``gain``; ``pid``: ``kp``, ``ki``, ``kd``, ``p_ema``, ``d_ema``.
    Options given as None are dropped (so a config can leave them unset), except that
    ``proportional`` with no target (absent or None) is a **fixed** beta, as in trlx, where a
    missing ``target`` selects the fixed controller; the caller can tell from
    :func:`is_fixed_fallback` and should say so.
    """
    if is_fixed_fallback(name, options):
        ProportionalKL(**{**_given(options), "target": 1.0})  # the options must still be valid
        return FixedKL(**{k: v for k, v in _given(options).items()
                          if k in ("beta", "beta_min", "beta_max")})
    try:
        cls = CONTROLLERS[name]
    except KeyError:
        raise ValueError(
            f"controller must be one of {sorted(CONTROLLERS)}, got controller={name!r}"
        ) from None
    import inspect

    accepted = set(inspect.signature(cls.__init__).parameters) - {"self"}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise ValueError(
            f"controller {name!r} does not take option(s) {unknown}; it takes {sorted(accepted)}"
        )
    return cls(**{k: v for k, v in options.items() if v is not None})
