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

The band (``eps``, asymmetric edges, dual clip), the beta_t shape and the catalogue's own
settings are small frozen values, :class:`Band`, :class:`ShapeSpec` and :class:`Knobs` (the base
class and these values live in :mod:`klppo.core.objective_base`). Besides the classic family
below, the table holds the trust-region catalogue: :mod:`klppo.core.trust_regions` (CISPO, SAPO,
SPO, the squared log-ratio, DPPO's masks), :mod:`klppo.core.covariance` (Clip-Cov, KL-Cov) and
:mod:`klppo.core.sequence_objectives` (GSPO, GMPO, trust-region masking).
:data:`OBJECTIVES` is the one table from names to objectives; :func:`make_objective` raises for
an unknown name. ``tests/nn/numpy/test_step.py`` generates its parity cases from this table, so a
new token-level entry is covered the moment it is added (sequence-level ones are refused).

This module uses numpy as well as torch (the closed forms run on numpy arrays).
"""

from __future__ import annotations

from klppo.core.covariance import COVARIANCE
from klppo.core.objective_base import (
    _CLIP,
    BAND_KNOBS,
    DEFAULT_BAND,
    DEFAULT_SHAPE,
    KL_ESTIMATOR_CHOICES,
    NO_KNOBS,
    Band,
    ClosedForm,
    Knobs,
    NoClosedForm,
    Objective,
    PolicyTerm,
    ShapeSpec,
)
from klppo.core.sequence_objectives import SEQUENCE_LEVEL
from klppo.core.surrogates import clip_objective, kl_penalty_objective, unclipped_objective
from klppo.core.trust_regions import TOKEN_LEVEL

__all__ = ["Band", "ShapeSpec", "Knobs", "PolicyTerm", "ClosedForm", "NoClosedForm", "Objective",
           "OBJECTIVES", "KL_ESTIMATOR_CHOICES", "BAND_KNOBS", "NO_KNOBS", "make_objective"]


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

    def closed_form(self, w, a, wa, logp, log_w, kl, beta, logp_old=None):
        bt = self._shape_beta_np(w, a, wa, _CLIP)
        return ClosedForm(self._clip_value_np(w, a, wa), wa + bt, None, None, bt)

    def rowwise_key(self):
        band = self._band_key()
        return None if band is None else (self.name, band)


class PerSampleKL(Objective):
    """The KLip-PPO template ``w A + beta_t logp_new``, beta_t of any shape, detached."""

    name = "per_sample_kl"
    shaped = True

    def term(self, ratio, logp_new, logp_old, advantage, kl, beta, want_beta=True):
        bt = self.beta_t(ratio, advantage)
        return PolicyTerm(ratio * advantage + bt * logp_new, bt, None)

    def beta_t(self, ratio, advantage):
        return self._shape_beta(ratio, advantage, self.shape)

    def closed_form(self, w, a, wa, logp, log_w, kl, beta, logp_old=None):
        bt = self._shape_beta_np(w, a, wa, self.shape)
        return ClosedForm(wa + bt * logp, wa + bt, None, None, bt)

    def rowwise_key(self):
        band = self._band_key()  # the other shapes run the core's torch definitions
        return None if band is None or self.shape.name != "clip" else (self.name, band)


class KLPenalty(Objective):
    """PPO-KL, ``w A - beta KL`` with a controller's scalar beta."""

    name = "kl_penalty"
    uses_beta = penalised = True
    band_knobs = ()

    def term(self, ratio, logp_new, logp_old, advantage, kl, beta, want_beta=True):
        k = self._penalty_kl(logp_new, logp_old, kl)
        return PolicyTerm(kl_penalty_objective(ratio, advantage, k, beta), None, k)

    def closed_form(self, w, a, wa, logp, log_w, kl, beta, logp_old=None):
        return self._penalise_np(ClosedForm(wa.copy(), wa.copy(), None, None), log_w, kl, beta)

    def rowwise_key(self):
        return (self.name, self.kl_estimator)


class Unclipped(Objective):
    """Plain importance sampling ``w A`` (no trust region)."""

    name = "unclipped"
    band_knobs = ()

    def term(self, ratio, logp_new, logp_old, advantage, kl, beta, want_beta=True):
        return PolicyTerm(unclipped_objective(ratio, advantage), None, None)

    def closed_form(self, w, a, wa, logp, log_w, kl, beta, logp_old=None):
        return ClosedForm(wa.copy(), wa.copy(), None, None)

    def rowwise_key(self):
        return (self.name,)


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

    def closed_form(self, w, a, wa, logp, log_w, kl, beta, logp_old=None):
        bt = self._shape_beta_np(w, a, wa, _CLIP)
        form = ClosedForm(self._clip_value_np(w, a, wa), wa + bt, None, None, bt)
        return self._penalise_np(form, log_w, kl, beta)

    def rowwise_key(self):
        band = self._band_key()
        return None if band is None else (self.name, band, self.kl_estimator)


#: objective name -> class. The only dispatch on objective names in klppo: the classic family
#: above, the token-level catalogue (:mod:`~klppo.core.trust_regions`,
#: :mod:`~klppo.core.covariance`) and the sequence-level one
#: (:mod:`~klppo.core.sequence_objectives`).
OBJECTIVES: dict[str, type[Objective]] = {
    cls.name: cls for cls in (Clip, PerSampleKL, KLPenalty, Unclipped, ClipKL, *TOKEN_LEVEL,
                              *COVARIANCE, *SEQUENCE_LEVEL)
}


def make_objective(name: str, band: Band = DEFAULT_BAND, shape: ShapeSpec = DEFAULT_SHAPE,
                   kl_estimator: str = "analytic", knobs: Knobs = NO_KNOBS) -> Objective:
    """The objective called ``name``; ValueError naming the choices for an unknown one, or a
    knob it does not read."""
    try:
        cls = OBJECTIVES[name]
    except (KeyError, TypeError):
        raise ValueError(f"objective must be one of {sorted(OBJECTIVES)}, got "
                         f"objective={name!r}") from None
    return cls(band, shape, kl_estimator, knobs)
