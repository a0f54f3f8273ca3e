"""What every beta controller shares (:class:`KLController`): the clamped beta, the update at a
named point, the record of the last update (:class:`UpdateInfo`) and the checkpointable state.
The rules themselves are in :mod:`klppo.core.controllers`."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

__all__ = ["UpdateInfo", "KLController", "BoundWatch"]


@dataclass(frozen=True)
class UpdateInfo:
    """What one controller update saw and did (logged by the trainer every update)."""

    target: float | None
    """Target KL (same unit as ``observed``); None for a fixed controller without a target."""
    observed: float
    """The KL the controller was fed."""
    relative_error: float | None
    """``observed / target - 1`` before any clipping (None without a target)."""
    error_clipped: bool
    """True when the proportional rule clipped the relative error to +-clip."""
    beta_before: float
    beta_after: float
    n_steps: int
    at_bound: str | None = None
    """``"beta_max"`` / ``"beta_min"`` when the rule asked for a beta beyond that bound in the
    direction the error pushes (the target is out of reach within the bounds), else None."""
    held: bool = False
    """True when beta was held because the KL has not yet reached the target (``hold``)."""

    @property
    def beta_change(self) -> float:
        """Multiplicative change ``beta_after / beta_before`` (nan when beta_before is 0)."""
        return self.beta_after / self.beta_before if self.beta_before != 0 else math.nan

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "beta_change": self.beta_change}


def _finite(name: str, value: float) -> float:
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {name}={value!r}")
    return v


def _positive(owner: str, name: str, value: float) -> float:
    v = float(value)
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{owner}: {name} must be finite and > 0, got {name}={value!r}")
    return v


class KLController:
    """Base class: holds beta and its bounds, validates, records :class:`UpdateInfo`.

    Args:
        beta: initial coefficient (>= 0).
        target: target KL (> 0), in the unit of the KL the caller will feed.
        beta_min: lower bound on beta (default 0).
        beta_max: upper bound on beta (default inf).
        hold: hold beta until the observed KL first reaches the target. A KL to a reference
            starts at 0 and ramps up as the policy moves: a rule fed that ramp lowers beta
            update after update (to its floor, with a short horizon) before the policy has
            moved, and the KL then overshoots while beta climbs back. With ``hold`` the rule
            starts once the KL first reaches the target (see docs/algorithms.md).
        hold_limit: with ``hold``, the most updates beta is held (None: until the KL reaches
            the target). A start beta strong enough to keep the KL below the target would
            otherwise never be released.
    """

    name: ClassVar[str] = "base"
    requires_target: ClassVar[bool] = True

    def __init__(
        self,
        beta: float = 1.0,
        target: float | None = None,
        beta_min: float = 0.0,
        beta_max: float = math.inf,
        hold: bool = False,
        hold_limit: int | None = None,
    ) -> None:
        cls = type(self).__name__
        if not isinstance(hold, bool):
            raise ValueError(f"{cls}: hold must be True or False, got hold={hold!r}")
        if hold_limit is not None:
            if isinstance(hold_limit, bool) or not isinstance(hold_limit, int) or hold_limit < 1:
                raise ValueError(f"{cls}: hold_limit must be an integer >= 1 or None, got "
                                 f"hold_limit={hold_limit!r}")
            if not hold:
                raise ValueError(f"{cls}: hold_limit={hold_limit} bounds a hold: set hold=True")
        if target is None:
            if self.requires_target:
                raise ValueError(f"{cls}: target is required, got target=None")
        else:
            target = _positive(cls, "target", target)
        beta_min, beta_max = float(beta_min), float(beta_max)
        if not (beta_min >= 0 and not math.isnan(beta_min)):
            raise ValueError(f"{cls}: beta_min must be >= 0, got beta_min={beta_min!r}")
        if beta_min > beta_max:
            raise ValueError(
                f"{cls}: beta_min must be <= beta_max, got beta_min={beta_min!r} > "
                f"beta_max={beta_max!r}"
            )
        beta = float(beta)
        if not (math.isfinite(beta) and beta >= 0):
            raise ValueError(f"{cls}: beta must be finite and >= 0, got beta={beta!r}")
        self.target = target
        self.beta_min = beta_min
        self.beta_max = beta_max
        self._beta = self._clamp(beta)
        self.info: UpdateInfo | None = None
        self.num_updates = 0
        self.hold = hold
        self.hold_limit = hold_limit
        self.reached = False  # the observed KL has reached the target (for ``hold``)

    # ------------------------------------------------------------------ interface
    @property
    def value(self) -> float:
        """The current beta."""
        return self._beta

    def update(self, observed_kl: float, n_steps: int = 1) -> float:
        """Feed one KL measurement; return the new beta.

        Args:
            observed_kl: the measured KL, in the unit of ``target``.
            n_steps: samples (or episodes) the measurement covers; only the proportional rule
                uses it (trlx / Ziegler's ``n_steps / horizon``).
        """
        d = _finite("observed_kl", observed_kl)
        n = int(n_steps)
        if n < 1:
            raise ValueError(f"n_steps must be >= 1, got n_steps={n_steps!r}")
        before = self._beta
        raw_error = None if self.target is None else d / self.target - 1.0
        if self.target is not None and d >= self.target:
            self.reached = True
        held = self.hold and not self.reached and (
            self.hold_limit is None or self.num_updates < self.hold_limit)
        proposed, clipped = (before, False) if held else self._next_beta(d, n)
        self._beta = self._clamp(proposed)
        self.num_updates += 1
        self.info = UpdateInfo(
            target=self.target,
            observed=d,
            relative_error=raw_error,
            error_clipped=clipped,
            beta_before=before,
            beta_after=self._beta,
            n_steps=n,
            at_bound=self._bound_hit(proposed, raw_error),
            held=held,
        )
        return self._beta

    def _bound_hit(self, proposed: float, error: float | None) -> str | None:
        """The bound that stopped beta where the error asks for more of the same direction."""
        if error is None:
            return None
        if error > 0 and proposed >= self.beta_max:
            return "beta_max"
        if error < 0 and proposed <= self.beta_min:
            return "beta_min"
        return None

    def _next_beta(self, d: float, n_steps: int) -> tuple[float, bool]:  # pragma: no cover
        raise NotImplementedError

    def _clamp(self, beta: float) -> float:
        return min(max(beta, self.beta_min), self.beta_max)

    # ------------------------------------------------------------------ state
    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue identically: beta, update count, internal state."""
        return {
            "name": self.name,
            "beta": self._beta,
            "num_updates": self.num_updates,
            "info": None if self.info is None else asdict(self.info),
            "reached": self.reached,
            **self._extra_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`; ``ValueError`` naming the field for a state that is not
        a controller's of this rule (a wrong type, a beta that is not finite or lies outside
        ``[beta_min, beta_max]``, a negative update count)."""
        if not isinstance(state, dict):
            raise ValueError(f"state_dict must be a mapping, got {type(state).__name__}")
        if state.get("name") != self.name:
            raise ValueError(
                f"state_dict is for controller {state.get('name')!r}, not {self.name!r}"
            )
        beta = state.get("beta")
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not \
                math.isfinite(beta) or not self.beta_min <= beta <= self.beta_max:
            raise ValueError(f"beta={beta!r}: must be a finite number in [beta_min, beta_max] = "
                             f"[{self.beta_min}, {self.beta_max}]")
        n = state.get("num_updates")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"num_updates={n!r}: must be an integer >= 0")
        info = state.get("info")
        if info is not None and not isinstance(info, dict):
            raise ValueError(f"info={type(info).__name__}: must be a mapping or null")
        reached = state.get("reached", False)
        if not isinstance(reached, bool):
            raise ValueError(f"reached={reached!r}: must be true or false")
        try:
            record = None if info is None else UpdateInfo(**info)
        except TypeError as e:
            raise ValueError(f"info: {e}") from None
        self._beta, self.num_updates, self.info, self.reached = float(beta), n, record, reached
        self._load_extra_state(state)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(beta={self._beta:.6g}, target={self.target})"


class BoundWatch:
    """Which bound of beta a controller presses on (``UpdateInfo.at_bound``, one update at a
    time), and whether it has now pressed on it for ``need`` updates in a row for the first
    time (then the caller says so, once per bound): a noisy KL that dips past the target for an
    update or two is no sign the target is out of reach."""

    def __init__(self) -> None:
        self.bound: str | None = None
        self.since = 0  # the step or iteration it started pressing on ``bound``
        self.count = 0
        self.warned: set[str] = set()

    def see(self, bound: str | None, at: int, need: int) -> bool:
        if bound != self.bound:
            self.bound, self.since, self.count = bound, at, 0
        if bound is None:
            return False
        self.count += 1
        if self.count >= need and bound not in self.warned:
            self.warned.add(bound)
            return True
        return False
