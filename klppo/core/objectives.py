"""Each PPO objective is ONE object: its value, its derivative, its beta_t and what it needs.

Every objective of the family is, per sample, ``w A + beta_t logp_new`` up to terms without a
gradient, optionally minus ``beta * KL`` with a controller's scalar beta. An :class:`Objective`
says so once:

* :meth:`Objective.term` - the per-sample value to maximise, in torch, differentiable (what
  :class:`~klppo.core.loss.PPOLoss` and autograd use);
* :meth:`Objective.closed_form` - the same value and its derivatives in closed form on float32
  numpy arrays: ``d obj / d logp_new`` (``w A + beta_t``, minus ``beta dk/dlogp_new`` for a
  sampled KL estimator ``k``) and ``d obj / d KL`` (``-beta`` for the analytic KL). This is what
  the numpy fast path (:mod:`klppo.nn.numpy`) runs; an objective without it raises
  :class:`NoClosedForm`, and the fast path refuses it instead of running another gradient;
* :meth:`Objective.beta_t` - the detached per-sample coefficient (a diagnostic for the clip);
* ``uses_beta`` (reads a controller's beta) and ``needs_kl`` (the caller must pass the analytic
  per-state KL).

The band (``eps``, asymmetric edges, dual clip) and the beta_t shape are small frozen values,
:class:`Band` and :class:`ShapeSpec`. :data:`OBJECTIVES` is the one table from names to
objectives; :func:`make_objective` raises for an unknown name. ``tests/nn/numpy/test_step.py``
generates its parity cases from this table, so a new entry is covered the moment it is added.

This module uses numpy as well as torch (the closed forms run on numpy arrays).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, cast

import numpy as np
import torch

from klppo.core.band import DEFAULT_EPS, kill_mask
from klppo.core.kl import ESTIMATOR_GRADS, ESTIMATORS, Estimator, sampled_kl
from klppo.core.surrogates import (
    SHAPES,
    ShapeLike,
    clip_objective,
    kl_penalty_objective,
    per_sample_beta,
    unclipped_objective,
)

__all__ = ["Band", "ShapeSpec", "PolicyTerm", "ClosedForm", "NoClosedForm", "Objective",
           "OBJECTIVES", "KL_ESTIMATOR_CHOICES", "make_objective"]

#: what a penalty objective may use as its per-sample KL(pi_old || pi_new)
KL_ESTIMATOR_CHOICES: tuple[str, ...] = ("analytic", *ESTIMATORS)


@dataclass(frozen=True)
class Band:
    """The trust band ``[1 - lo, 1 + hi]`` of the ratio, and the dual clip ``c > 1`` (or None).

    ``eps`` is the symmetric radius; ``eps_low`` / ``eps_high`` override one side (DAPO: 0.2 /
    0.28). Radii may be floats or per-sample tensors (position-aware clipping)."""

    eps: Any = DEFAULT_EPS
    eps_low: Any = None
    eps_high: Any = None
    dual_clip: float | None = None

    @property
    def lo(self) -> Any:
        return self.eps if self.eps_low is None else self.eps_low

    @property
    def hi(self) -> Any:
        return self.eps if self.eps_high is None else self.eps_high

    @property
    def is_scalar(self) -> bool:
        return not any(isinstance(e, torch.Tensor) for e in (self.eps, self.eps_low,
                                                              self.eps_high))


@dataclass(frozen=True)
class ShapeSpec:
    """A beta_t shape of the per-sample template and its softness (see
    :mod:`klppo.core.surrogates`): a name of :data:`~klppo.core.surrogates.SHAPES` or a callable
    ``(ratio, advantage) -> beta_t``."""

    name: ShapeLike = "clip"
    softness: Any = None
    softness_low: Any = None
    softness_high: Any = None


@dataclass(frozen=True)
class PolicyTerm:
    """An objective's torch output: per-sample values to maximise, beta_t where defined (and
    asked for), and the per-sample KL the penalty used."""

    objective: torch.Tensor
    beta_t: torch.Tensor | None
    kl: torch.Tensor | None


@dataclass
class ClosedForm:
    """An objective in closed form on numpy arrays (per sample): ``value`` to maximise,
    ``d_logp`` = d value / d logp_new, ``d_kl`` = d value / d analytic KL (None when the
    analytic KL is not used), ``penalty`` (the per-sample KL the penalty used, or None) and
    ``beta_t`` (the detached per-sample coefficient, None where the objective has none)."""

    value: np.ndarray
    d_logp: np.ndarray
    d_kl: np.ndarray | None
    penalty: np.ndarray | None
    beta_t: np.ndarray | None = None


class NoClosedForm(NotImplementedError):
    """The objective has no closed-form derivative: the numpy fast path cannot serve it."""


def _clip_beta_np(w: np.ndarray, a: np.ndarray, wa: np.ndarray, band: Band) -> np.ndarray:
    """The clip shape's beta_t (``-w A`` on the kill set, else 0) on numpy arrays; equal bit for
    bit to :func:`~klppo.core.surrogates.per_sample_beta` (edges compared in float32 by both)."""
    kill = kill_mask(w, a, band.lo, band.hi)
    if band.dual_clip is not None:
        kill |= (a < 0) & (w > band.dual_clip)
    return np.where(kill, -wa, np.float32(0))


class Objective:
    """Base of the PPO objectives; see the module docstring. Subclasses set ``name`` and
    ``uses_beta``, implement :meth:`term` and, where they can, :meth:`closed_form`."""

    name: ClassVar[str] = ""
    uses_beta: ClassVar[bool] = False
    penalised: ClassVar[bool] = False  # subtracts beta * KL (so its kl_estimator matters)
    shaped: ClassVar[bool] = False  # its beta_t follows ``shape`` (so the shape matters)
    clipped: ClassVar[bool] = True  # it reads the band (eps, eps_low/high, dual_clip)

    def __init__(self, band: Band = Band(), shape: ShapeSpec = ShapeSpec(),
                 kl_estimator: str = "analytic") -> None:
        if kl_estimator not in KL_ESTIMATOR_CHOICES:
            raise ValueError(f"kl_estimator must be one of {list(KL_ESTIMATOR_CHOICES)}, got "
                             f"kl_estimator={kl_estimator!r}")
        if not callable(shape.name) and shape.name not in SHAPES:
            raise ValueError(f"shape must be one of {list(SHAPES)}, got shape={shape.name!r}")
        self.band, self.shape, self.kl_estimator = band, shape, kl_estimator

    @property
    def needs_kl(self) -> bool:
        """True when the caller must pass the analytic per-state KL(pi_old || pi_new)."""
        return self.penalised and self.kl_estimator == "analytic"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.band}, {self.shape}, {self.kl_estimator!r})"

    # ------------------------------------------------------------------ torch
    def term(self, ratio, logp_new, logp_old, advantage, kl, beta, want_beta=True) -> PolicyTerm:
        raise NotImplementedError

    def beta_t(self, ratio: torch.Tensor, advantage: torch.Tensor) -> torch.Tensor | None:
        """Detached per-sample beta_t of the template form, or None where it has none."""
        return None

    def _shape_beta(self, ratio, advantage, shape: ShapeSpec) -> torch.Tensor:
        b = self.band
        return per_sample_beta(ratio, advantage, b.eps, shape.name, shape.softness, b.eps_low,
                               b.eps_high, shape.softness_low, shape.softness_high, b.dual_clip)

    def _penalty_kl(self, logp_new, logp_old, kl) -> torch.Tensor:
        if self.kl_estimator == "analytic":
            if kl is None:
                raise ValueError(
                    f"objective {self.name!r} with kl_estimator='analytic' needs kl= (the "
                    "per-state analytic KL(pi_old || pi_new)); pass it or choose a sampled "
                    "estimator")
            return kl
        return sampled_kl(logp_old, logp_new, cast(Estimator, self.kl_estimator))

    # ------------------------------------------------------------------ numpy
    def closed_form(self, w, a, wa, logp, log_w, kl, beta: float) -> ClosedForm:
        """Value and derivatives on float32 arrays: ``w`` ratio, ``a`` advantage, ``wa = w a``,
        ``logp`` = logp_new, ``log_w`` = logp_new - logp_old, ``kl`` the analytic KL."""
        raise NoClosedForm(f"objective {self.name!r} has no closed-form derivative")

    @property
    def has_closed_form(self) -> bool:
        return type(self).closed_form is not Objective.closed_form

    def _shape_beta_np(self, w, a, wa, shape: ShapeSpec) -> np.ndarray:
        if shape.name == "clip" and self.band.is_scalar:
            return _clip_beta_np(w, a, wa, self.band)
        with torch.no_grad():  # the core's shapes, on zero-copy views
            return self._shape_beta(torch.from_numpy(w), torch.from_numpy(np.asarray(a)),
                                    shape).numpy()

    def _clip_value_np(self, w, a, wa) -> np.ndarray:
        lo, hi = self.band.lo, self.band.hi
        value = np.minimum(wa, np.minimum(np.maximum(w, 1 - lo), 1 + hi) * a)
        if self.band.dual_clip is not None:
            value = np.where(a < 0, np.maximum(value, self.band.dual_clip * a), value)
        return value

    def _penalise_np(self, form: ClosedForm, log_w, kl, beta: float) -> ClosedForm:
        """Subtract ``beta * KL`` from a closed form (analytic or sampled estimator)."""
        b = np.float32(beta)
        if self.kl_estimator == "analytic":
            pen = kl
            form.d_kl = np.full(kl.shape[0], -b, np.float32)
        else:
            pen = ESTIMATORS[self.kl_estimator](log_w)
            form.d_logp = form.d_logp - b * ESTIMATOR_GRADS[self.kl_estimator](log_w)
        form.value, form.penalty = form.value - b * pen, pen
        return form


_CLIP = ShapeSpec("clip")


class Clip(Objective):
    """PPO-Clip, ``min(w A, clip(w) A)`` (dual clip optional); gradient ``w A + beta_t`` with the
    clip shape's beta_t (Theorem 1)."""

    name = "clip"

    def term(self, ratio, logp_new, logp_old, advantage, kl, beta, want_beta=True):
        b = self.band
        obj = clip_objective(ratio, advantage, b.eps, b.eps_low, b.eps_high, b.dual_clip)
        return PolicyTerm(obj, self.beta_t(ratio, advantage) if want_beta else None, None)

    def beta_t(self, ratio, advantage):
        return self._shape_beta(ratio, advantage, _CLIP)

    def closed_form(self, w, a, wa, logp, log_w, kl, beta):
        bt = self._shape_beta_np(w, a, wa, _CLIP)
        return ClosedForm(self._clip_value_np(w, a, wa), wa + bt, None, None, bt)


class PerSampleKL(Objective):
    """The KLip-PPO template ``w A + beta_t logp_new``, beta_t of any shape, detached."""

    name = "per_sample_kl"
    shaped = True

    def term(self, ratio, logp_new, logp_old, advantage, kl, beta, want_beta=True):
        bt = self.beta_t(ratio, advantage)
        return PolicyTerm(ratio * advantage + bt * logp_new, bt, None)

    def beta_t(self, ratio, advantage):
        return self._shape_beta(ratio, advantage, self.shape)

    def closed_form(self, w, a, wa, logp, log_w, kl, beta):
        bt = self._shape_beta_np(w, a, wa, self.shape)
        return ClosedForm(wa + bt * logp, wa + bt, None, None, bt)


class KLPenalty(Objective):
    """PPO-KL, ``w A - beta KL`` with a controller's scalar beta."""

    name = "kl_penalty"
    uses_beta = penalised = True
    clipped = False

    def term(self, ratio, logp_new, logp_old, advantage, kl, beta, want_beta=True):
        k = self._penalty_kl(logp_new, logp_old, kl)
        return PolicyTerm(kl_penalty_objective(ratio, advantage, k, beta), None, k)

    def closed_form(self, w, a, wa, logp, log_w, kl, beta):
        return self._penalise_np(ClosedForm(wa.copy(), wa.copy(), None, None), log_w, kl, beta)


class Unclipped(Objective):
    """Plain importance sampling ``w A`` (no trust region)."""

    name = "unclipped"
    clipped = False

    def term(self, ratio, logp_new, logp_old, advantage, kl, beta, want_beta=True):
        return PolicyTerm(unclipped_objective(ratio, advantage), None, None)

    def closed_form(self, w, a, wa, logp, log_w, kl, beta):
        return ClosedForm(wa.copy(), wa.copy(), None, None)


class ClipKL(Objective):
    """PPO-Clip plus a scalar KL penalty (RLlib's default)."""

    name = "clip_kl"
    uses_beta = penalised = True

    def term(self, ratio, logp_new, logp_old, advantage, kl, beta, want_beta=True):
        b = self.band
        k = self._penalty_kl(logp_new, logp_old, kl)
        obj = clip_objective(ratio, advantage, b.eps, b.eps_low, b.eps_high, b.dual_clip)
        return PolicyTerm(obj - beta * k, self.beta_t(ratio, advantage) if want_beta else None,
                          k)

    def beta_t(self, ratio, advantage):
        return self._shape_beta(ratio, advantage, _CLIP)

    def closed_form(self, w, a, wa, logp, log_w, kl, beta):
        bt = self._shape_beta_np(w, a, wa, _CLIP)
        form = ClosedForm(self._clip_value_np(w, a, wa), wa + bt, None, None, bt)
        return self._penalise_np(form, log_w, kl, beta)


#: objective name -> class. The only dispatch on objective names in klppo.
OBJECTIVES: dict[str, type[Objective]] = {
    cls.name: cls for cls in (Clip, PerSampleKL, KLPenalty, Unclipped, ClipKL)
}


def make_objective(name: str, band: Band = Band(), shape: ShapeSpec = ShapeSpec(),
                   kl_estimator: str = "analytic") -> Objective:
    """The objective called ``name``; ValueError naming the choices for an unknown one."""
    try:
        cls = OBJECTIVES[name]
    except (KeyError, TypeError):
        raise ValueError(f"objective must be one of {sorted(OBJECTIVES)}, got "
                         f"objective={name!r}") from None
    return cls(band, shape, kl_estimator)
