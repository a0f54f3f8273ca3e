"""The 2024-26 token-level trust regions as named objectives, each in the KLip-PPO template.

Every method here is a score-function surrogate whose gradient is ``c_t grad logp_new`` with a
detached ``c_t``, i.e. the template ``w A + beta_t logp_new`` with ``beta_t = c_t - w A``. Each
class states its per-sample value (the paper's formula), its coefficient ``c_t`` (the closed
form of ``d value / d logp_new``) and its source; ``tests/core/test_trust_regions.py`` checks
autograd of every value against an independent transcription of the paper's formula and
against ``w A + beta_t``, on random batches that include the band edges.

DAPO's clip-higher (Yu et al. 2025, arXiv:2503.14476, Eq. 10) is not a separate class: its
per-token term ``min(w A, clip(w, 1 - eps_low, 1 + eps_high) A)`` is exactly ``clip`` with
``eps_low = 0.2, eps_high = 0.28``, and its token-level aggregation (a mean over all tokens of
the batch) is what :class:`~klppo.core.loss.PPOLoss` does with the tokens it is given.

``w = pi_new / pi_old`` per sample, ``A`` the advantage (constant), ``log w = logp_new -
logp_old``, ``sg`` stop-gradient. Probabilities ``exp(logp)`` are only meaningful for discrete
actions or tokens: the DPPO masks refuse log-probabilities above 0 (a density).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from klppo.core.objective_base import (
    ClosedForm,
    Objective,
    PolicyTerm,
    ShapeSpec,
    TemplateObjective,
)
from klppo.core.surrogates import _clamp_band

__all__ = ["CISPO", "SAPO", "SPO", "SquaredLogRatio", "RatioVariance", "DPPOBinaryTV",
           "DPPOBinaryKL", "binary_kl"]

_SPO = ShapeSpec("spo")


class CISPO(TemplateObjective):
    """CISPO (MiniMax-M1, arXiv:2506.13585): ``sg(clip(w, 1 - eps_low, 1 + eps_high)) A
    logp_new``. Every token keeps a gradient; the clipped ratio only weights it:
    ``c_t = clip(w) A``, ``beta_t = (clip(w) - w) A``. The paper sets no lower bound (use
    ``eps_low >= 1``) and tunes ``eps_high``; klppo's band defaults to ``eps`` on both sides."""

    name = "cispo"
    band_knobs = ("eps_low", "eps_high")

    def _clipped(self, w: torch.Tensor) -> torch.Tensor:
        return _clamp_band(w.detach(), self.band.lo, self.band.hi)

    def value(self, ratio, logp_new, logp_old, advantage, ctx):
        return self._clipped(ratio) * advantage * logp_new

    def coefficient(self, w, logp_new, logp_old, advantage, ctx):
        return self._clipped(w) * advantage

    def beta_t(self, ratio, advantage):
        w = ratio.detach()
        return (self._clipped(w) - w) * advantage


class SAPO(TemplateObjective):
    """SAPO (Qwen, Gao et al. 2025, arXiv:2511.20347): ``f(w) A`` with the soft gate
    ``f(w) = 4 / tau sigmoid(tau (w - 1))``, ``tau = tau_pos`` where ``A > 0`` and ``tau_neg``
    elsewhere (paper defaults 1.0 and 1.05). ``f'(1) = 1``: at ``w = 1`` the gradient is the
    unclipped one, and it decays smoothly away from 1. ``c_t = 4 s (1 - s) w A`` with
    ``s = sigmoid(tau (w - 1))``; ``beta_t = (4 s (1 - s) - 1) w A``."""

    name = "sapo"
    band_knobs = ()
    knobs = {"tau_pos": 1.0, "tau_neg": 1.05}

    def _tau(self, advantage: torch.Tensor) -> torch.Tensor:
        pos = torch.tensor(self.knob("tau_pos"), dtype=advantage.dtype, device=advantage.device)
        neg = torch.tensor(self.knob("tau_neg"), dtype=advantage.dtype, device=advantage.device)
        return torch.where(advantage > 0, pos, neg)

    def value(self, ratio, logp_new, logp_old, advantage, ctx):
        tau = self._tau(advantage)
        return 4 / tau * torch.sigmoid(tau * (ratio - 1)) * advantage

    def coefficient(self, w, logp_new, logp_old, advantage, ctx):
        x = self._tau(advantage) * (w - 1)
        return 4 * torch.sigmoid(x) * torch.sigmoid(-x) * w * advantage

    def beta_t(self, ratio, advantage):
        w = ratio.detach()
        return self.coefficient(w, None, None, advantage, None) - w * advantage


class SPO(TemplateObjective):
    """Simple Policy Optimization (Xie et al., arXiv:2401.16025):
    ``w A - |A| (w - 1)^2 / (2 eps)``. ``c_t = w A - |A| w (w - 1) / eps``, i.e. the template
    with the ``spo`` beta_t shape ``-|A| w (w - 1) / eps`` (:mod:`klppo.core.surrogates`, the
    one definition both use): ``per_sample_kl --ppo.shape spo`` has the same gradient, this
    objective the paper's value. It reads ``eps`` only."""

    name = "spo"
    band_knobs = ()

    def value(self, ratio, logp_new, logp_old, advantage, ctx):
        eps = self.band.eps
        return ratio * advantage - advantage.abs() * (ratio - 1) ** 2 / (2 * eps)

    def coefficient(self, w, logp_new, logp_old, advantage, ctx):
        return w * advantage + self.beta_t(w, advantage)

    def beta_t(self, ratio, advantage):
        return self._shape_beta(ratio.detach(), advantage, _SPO)


class SquaredLogRatio(TemplateObjective):
    """The squared log-ratio penalty as Kimi k1.5 writes it (Kimi Team 2025, arXiv:2501.12599,
    Sec. 2.3.2: the gradient ``grad logp (r - mean r) - tau/2 grad (log pi/pi_old)^2``), per
    token: ``A log w - tau/2 (log w)^2`` (``A logp_new`` up to a constant). No importance
    weight: ``c_t = A - tau log w``, ``beta_t = A - tau log w - w A``. The same penalty on the
    importance-weighted surrogate, ``w A - tau/2 (log w)^2`` (DRO-style), is already
    ``kl_penalty`` with ``kl_estimator k2`` and a fixed beta ``tau``. The paper states no
    value of tau; klppo's default 1.0 is not from it."""

    name = "sq_log_ratio"
    band_knobs = ()
    knobs = {"tau": 1.0}

    def value(self, ratio, logp_new, logp_old, advantage, ctx):
        log_w = logp_new - logp_old
        return advantage * log_w - self.knob("tau") / 2 * log_w ** 2

    def coefficient(self, w, logp_new, logp_old, advantage, ctx):
        return advantage - self.knob("tau") * (logp_new - logp_old)

    def beta_t(self, ratio, advantage):
        w = ratio.detach()
        return advantage - self.knob("tau") * torch.log(w) - w * advantage


class RatioVariance(Objective):
    """R2VPO's ratio-variance penalty (Luo et al., arXiv:2601.03320 and arXiv:2605.26784), as
    klppo reads it: ``w A - lambda (w - 1)^2`` with the multiplier ``lambda`` = the controller's
    beta. Under the rollout policy ``E[w] = 1``, so ``(w - 1)^2`` is a one-sample estimate of
    the ratio's variance (its second central moment; the Pearson chi-square divergence of the
    new policy from the old), the quantity the papers constrain with a primal-dual method.
    ``c_t = w A - 2 lambda w (w - 1)``, ``beta_t = -2 lambda w (w - 1)``: a soft brake that
    never zeroes a sample's gradient, unlike the clip. The per-sample ``(w - 1)^2`` is the
    penalty's divergence (logged as ``kl_penalty``, unitless, not a KL), so a minibatch- or
    epoch-cadence controller measures the ratio variance. The dual ascent
    ``lambda <- max(0, lambda + eta (mean (w - 1)^2 - delta))`` is ``--kl.controller pid
    --kl.kp 0 --kl.ki eta --kl.target delta``.

    Only the papers' abstracts were available to klppo: the per-sample form ``(w - 1)^2``
    (rather than a batch's empirical variance), the dual step and any default ``delta`` or
    ``eta`` are klppo's reading, not checked against the papers' method sections."""

    name = "r2vpo"
    band_knobs = ()
    uses_beta = True
    penalty_unit = "ratio variance per sample (unitless)"

    def term(self, ratio, logp_new, logp_old, advantage, kl, beta, want_beta=True):
        w = ratio.detach()
        if beta == 0:  # the multiplier at its floor: no penalty (no 0 * inf for a huge ratio)
            obj, bt = ratio * advantage, torch.zeros_like(w) if want_beta else None
        else:
            obj = ratio * advantage - beta * (ratio - 1) ** 2
            bt = -2 * beta * w * (w - 1) if want_beta else None
        return PolicyTerm(obj, bt, (w - 1) ** 2)

    def closed_form(self, w, a, wa, logp, log_w, kl, beta, logp_old=None):
        dev = w - np.float32(1)
        pen = dev * dev
        if beta == 0:
            return ClosedForm(wa.copy(), wa.copy(), None, pen, np.zeros_like(wa))
        b = np.float32(beta)
        bt = np.float32(-2) * b * w * dev
        return ClosedForm(wa - b * pen, wa + bt, None, pen, bt)


def binary_kl(logp_old: torch.Tensor, logp_new: torch.Tensor) -> torch.Tensor:
    """KL(Bern(p_old) || Bern(p_new)) of the sampled token against all others, in nats:
    ``p_old log(p_old / p_new) + (1 - p_old) log((1 - p_old) / (1 - p_new))``, with
    ``log(1 - p) = log(-expm1(logp))`` (exact near p = 1) and the second term 0 where
    ``p_old = 1``."""
    p_old = logp_old.exp()
    log1m_old = torch.log(-torch.expm1(logp_old))
    log1m_new = torch.log(-torch.expm1(logp_new))
    rest = torch.where(p_old < 1, (1 - p_old) * (log1m_old - log1m_new), torch.zeros_like(p_old))
    return p_old * (logp_old - logp_new) + rest


class _DPPO(TemplateObjective):
    """DPPO's masked surrogate (Qi et al. 2026, "Rethinking the Trust Region in LLM
    Reinforcement Learning", arXiv:2602.04879; masks as in its code, sail-sg/Stable-RL
    ``_compute_token_mask_for_policy_loss``): ``M_t w A`` with ``M_t = 0`` where the token's
    divergence exceeds ``delta`` *and* the update moves it further in the advantage's direction
    (``p_new > p_old`` for ``A > 0``, ``p_new < p_old`` for ``A < 0``), else 1; ``c_t = M_t w A``,
    ``beta_t = -w A`` on the masked tokens. The divergence is measured against the rollout
    policy (``logp_old``)."""

    band_knobs = ()
    needs_probabilities = True

    def invalid(self, logp_new, logp_old, advantage) -> torch.Tensor:
        """Where the trust region masks the gradient (bool, from detached tensors)."""
        raise NotImplementedError

    def context(self, w, logp_new, logp_old, advantage) -> Any:
        if bool((logp_new > 0).any()) or bool((logp_old > 0).any()):
            raise ValueError(f"objective {self.name!r} needs log-probabilities <= 0 (discrete "
                             "actions or tokens); got a positive log-density (continuous "
                             "actions?)")
        return ~self.invalid(logp_new, logp_old, advantage)

    def value(self, ratio, logp_new, logp_old, advantage, ctx):
        return torch.where(ctx, ratio * advantage, torch.zeros_like(ratio))

    def coefficient(self, w, logp_new, logp_old, advantage, ctx):
        return torch.where(ctx, w * advantage, torch.zeros_like(w))


class DPPOBinaryTV(_DPPO):
    """DPPO-Binary-TV: the divergence is the total variation of the binary distribution
    {sampled token, the rest}, ``|p_new - p_old|``; masked where ``A > 0`` and
    ``p_new - p_old > delta``, or ``A < 0`` and ``p_new - p_old < -delta`` (delta 0.15 in the
    authors' script). ``delta`` is a probability difference."""

    name = "dppo_tv"
    knobs = {"delta": 0.15}

    def invalid(self, logp_new, logp_old, advantage):
        d, delta = logp_new.exp() - logp_old.exp(), self.knob("delta")
        return ((advantage > 0) & (d > delta)) | ((advantage < 0) & (d < -delta))


class DPPOBinaryKL(_DPPO):
    """DPPO-Binary-KL: the divergence is :func:`binary_kl` ``KL(Bern(p_old) || Bern(p_new))``
    (nats per token); masked where it exceeds ``delta`` (0.05 in the authors' script) and
    ``p_new > p_old`` for ``A > 0`` or ``p_new < p_old`` for ``A < 0``."""

    name = "dppo_kl"
    knobs = {"delta": 0.05}

    def invalid(self, logp_new, logp_old, advantage):
        far = binary_kl(logp_old, logp_new) > self.knob("delta")
        up, down = logp_new > logp_old, logp_new < logp_old
        return far & (((advantage > 0) & up) | ((advantage < 0) & down))


#: the token-level catalogue classes of this module
TOKEN_LEVEL = (CISPO, SAPO, SPO, SquaredLogRatio, RatioVariance, DPPOBinaryTV,
               DPPOBinaryKL)
