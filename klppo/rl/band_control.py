"""The clip-bound controller in the update loop: BAPO moving both band edges every minibatch.

``ppo.band_controller bapo`` runs BAPO's adaptive clipping (:mod:`klppo.core.bound_controllers`,
arXiv:2510.18927 Algorithm 1). Before every minibatch step a :class:`BandControl` reads the
minibatch's ratio ``w = pi_current / pi_rollout`` (a forward pass before the step, like the
rsl_rl lr rule's KL) and the advantage the objective sees (after minibatch normalisation, if
on), lets the rule choose ``[c_low, c_high]`` from its start bounds, and sets the loss's band to
``eps_low = 1 - c_low``, ``eps_high = c_high - 1`` for that step. The rule has no memory across
steps; its last record is part of the checkpoint (``band_controller``) so the logs continue.
:func:`check_band_controller` refuses what it cannot serve, in one line.
"""

from __future__ import annotations

from typing import Any

import torch

from klppo.core.advantages import normalize_advantage
from klppo.core.band import DEFAULT_EPS
from klppo.core.bound_controllers import BAPO_DEFAULTS, BalanceStats, BAPOController
from klppo.core.loss import PPOLoss
from klppo.runs.errors import ConfigError
from klppo.runs.typecheck import short_repr

__all__ = ["BAND_CONTROLLERS", "BandControl", "check_band_controller", "make_band_controller"]

#: the values of ``ppo.band_controller``
BAND_CONTROLLERS = ("none", "bapo")

#: the ``ppo.bapo_*`` fields and the controller argument each sets
_FIELDS = {"bapo_target": "target", "bapo_low": "low", "bapo_high": "high",
           "bapo_step_high": "step_high", "bapo_step_low": "step_low"}


def _bad(name: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"{name}={short_repr(value)}: {why}")


def make_band_controller(p: Any) -> BAPOController:
    """The BAPO controller of a ``PPOConfig``; ConfigError naming the ``ppo.bapo_*`` field."""
    try:
        return BAPOController(**{arg: getattr(p, f) for f, arg in _FIELDS.items()})
    except ValueError as e:
        raise ConfigError(f"ppo.bapo_{e}") from None


def check_band_controller(cfg: Any) -> None:
    """Refuse a band controller that is unknown, ignored or at odds with another field."""
    p = cfg.ppo
    if p.band_controller not in BAND_CONTROLLERS:
        raise _bad("ppo.band_controller", p.band_controller, f"must be one of "
                   f"{list(BAND_CONTROLLERS)}")
    if p.band_controller == "none":
        for f, arg in _FIELDS.items():
            if getattr(p, f) != BAPO_DEFAULTS[arg]:
                raise _bad(f"ppo.{f}", getattr(p, f), "only ppo.band_controller bapo reads it")
        return
    what = "ppo.band_controller=bapo"
    if not (cfg.objective == "clip" or (cfg.objective == "per_sample_kl" and p.shape == "clip")):
        raise _bad("objective", cfg.objective, f"{what} balances the PPO-Clip surrogate (BAPO's "
                   f"Eq. 8): use clip, or per_sample_kl with ppo.shape clip")
    for name, value in (("ppo.eps_low", p.eps_low), ("ppo.eps_high", p.eps_high),
                        ("ppo.dual_clip", p.dual_clip)):
        if value is not None:
            raise _bad(name, value, f"{what} sets both band edges every minibatch and has no "
                       f"dual clip (its ranges are ppo.bapo_low / ppo.bapo_high)")
    if p.eps != DEFAULT_EPS:
        raise _bad("ppo.eps", p.eps, f"{what} sets both band edges, so ppo.eps is unused (its "
                   f"ranges are ppo.bapo_low / ppo.bapo_high)")
    if cfg.kl.actuator == "clip":
        raise _bad("kl.actuator", "clip", f"{what} already moves the clip band; one rule per "
                   f"band (kl.actuator lr or beta may go with it)")
    make_band_controller(p)


class BandControl:
    """Feeds the BAPO rule each minibatch's ratio and advantage before its step and puts the
    chosen edges into the loss's band. The update loop calls :meth:`begin` once per update and
    :meth:`before_step` before every minibatch step."""

    def __init__(self, rule: BAPOController, backend: Any, loss: PPOLoss) -> None:
        self.rule, self.backend, self.loss = rule, backend, loss
        self.used: list[tuple[float, float]] = []
        self.records: list[dict[str, Any]] = []
        self.adv: torch.Tensor | None = None
        self.apply()

    @classmethod
    def from_config(cls, cfg: Any, backend: Any, loss: PPOLoss) -> BandControl | None:
        """The band control ``ppo.band_controller`` asks for, or None for ``none``."""
        if cfg.ppo.band_controller == "none":
            return None
        return cls(make_band_controller(cfg.ppo), backend, loss)

    def apply(self) -> None:
        """Put the rule's edges into the loss's band."""
        self.loss.set_edges(*self.rule.edges)

    def begin(self, adv: torch.Tensor) -> None:
        """A new update over the rollout advantages ``adv`` (as the backend was given them)."""
        self.adv, self.used, self.records = adv, [], []

    def before_step(self, idx: torch.Tensor) -> None:
        """Measure the minibatch, choose its bounds, set them for its step."""
        assert self.adv is not None, "begin() first"
        a = torch.as_tensor(self.adv)[idx]
        if self.loss.normalize_advantage == "minibatch":
            a = normalize_advantage(a)
        self.rule.update(BalanceStats.from_samples(self.backend.ratio(idx), a))
        self.apply()
        self.used.append(self.rule.edges)
        self.records.append(self.rule.info.as_dict())  # type: ignore[union-attr]

    def metrics(self) -> dict[str, float]:
        """The last step's bounds and shares, the iteration's means and the share of steps that
        met the target (docs/metrics.md)."""
        info = self.rule.info
        if info is None or not self.records:
            return {}
        n = len(self.records)
        return {"bapo_c_low": info.c_low, "bapo_c_high": info.c_high,
                "bapo_share": info.share, "bapo_share_start": info.share_start,
                "bapo_c_low_mean": sum(r["c_low"] for r in self.records) / n,
                "bapo_c_high_mean": sum(r["c_high"] for r in self.records) / n,
                "bapo_met_fraction": sum(r["met"] for r in self.records) / n,
                "bapo_target": self.rule.target, "bapo_updates": float(n)}

    def state_dict(self) -> dict[str, Any]:
        return self.rule.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the rule's record and put its edges into the band."""
        self.rule.load_state_dict(state)
        self.apply()
