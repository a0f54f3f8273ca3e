"""Clip-Cov and KL-Cov: trust regions on the tokens whose log-probability and advantage covary most.

Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models"
(arXiv:2505.22617): entropy falls where ``log pi`` and ``A`` covary, so a small share of
tokens, chosen by their centred covariance over the batch

    cov_t = (logp_t - mean logp) (A_t - mean A)

(``logp`` the current policy's, detached; means over the tokens the objective is given: one
minibatch), loses its gradient (Clip-Cov) or pays a KL penalty (KL-Cov). The base surrogates
follow the authors' code (PRIME-RL/Entropy-Mechanism-of-RL, ``compute_policy_loss_clip_cov`` /
``_kl_cov``): Clip-Cov on PPO-Clip, with the tokens the clip already stops excluded from the
candidates; KL-Cov on the unclipped ``w A``.

**Selection is deterministic by default.** The paper draws Clip-Cov's tokens uniformly at random
among the candidates; klppo takes the candidates with the largest covariance (ties: the earlier
token), so a run is a function of its seed without another generator to checkpoint. Pass
``generator=`` to :class:`ClipCov` for the paper's uniform draw (``klppo rlhf
--cov-selection random``). KL-Cov's top-k rule is
deterministic in the paper already. Both select ``k = max(1, floor(cov_fraction N))`` of the
``N`` tokens (the code's ``max(1, ...)``; the paper's ``floor`` alone selects none below
``1 / cov_fraction`` tokens).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from klppo.core.band import kill_mask
from klppo.core.objective_base import (
    _CLIP,
    BAND_KNOBS,
    DEFAULT_BAND,
    DEFAULT_SHAPE,
    NO_KNOBS,
    Band,
    Knobs,
    ShapeSpec,
    TemplateObjective,
)
from klppo.core.surrogates import clip_objective

__all__ = ["token_covariance", "select_top", "ClipCov", "KLCov"]


def token_covariance(logp: torch.Tensor, advantage: torch.Tensor) -> torch.Tensor:
    """``(logp_t - mean logp) (A_t - mean A)`` per token, from detached tensors."""
    logp, advantage = logp.detach(), advantage.detach()
    return (logp - logp.mean()) * (advantage - advantage.mean())


def _count(fraction: float, n: int) -> int:
    return max(1, math.floor(fraction * n))


def select_top(score: torch.Tensor, candidates: torch.Tensor, k: int,
               generator: torch.Generator | None = None) -> torch.Tensor:
    """Bool mask of ``min(k, #candidates)`` candidates: those with the largest ``score`` (a
    stable sort: ties go to the earlier index), or, with a ``generator``, a uniform draw."""
    idx = candidates.reshape(-1).nonzero().reshape(-1)
    if generator is not None:
        order = torch.randperm(idx.numel(), generator=generator, device=generator.device)
        chosen = idx[order.to(idx.device)[:k]]
    else:
        vals = score.reshape(-1)[idx]
        chosen = idx[torch.sort(vals, descending=True, stable=True).indices[:k]]
    out = torch.zeros(score.numel(), dtype=torch.bool, device=score.device)
    out[chosen] = True
    return out.reshape(score.shape)


class ClipCov(TemplateObjective):
    """Clip-Cov (arXiv:2505.22617): PPO-Clip, except that ``k`` tokens with
    ``cov_low < cov_t < cov_high`` (paper: 1 and 5) among those the clip does not already stop
    lose their gradient (value 0): ``c_t = w A + beta_t^clip`` off the selection, 0 on it, so
    ``beta_t = -w A`` on the kill set and the selection. ``cov_fraction`` (paper: 2e-4) sets
    ``k``. ``generator``: the paper's uniform draw instead of the top-covariance rule."""

    name = "clip_cov"
    band_knobs = BAND_KNOBS
    knobs = {"cov_fraction": 2e-4, "cov_low": 1.0, "cov_high": 5.0}

    def __init__(self, band: Band = DEFAULT_BAND, shape: ShapeSpec = DEFAULT_SHAPE,
                 kl_estimator: str = "analytic", knobs: Knobs = NO_KNOBS,
                 generator: torch.Generator | None = None) -> None:
        super().__init__(band, shape, kl_estimator, knobs)
        self.generator = generator

    def _check_knobs(self) -> None:
        super()._check_knobs()
        if not self.knob("cov_fraction") <= 1:
            raise ValueError(f"cov_fraction must be in (0, 1], got {self.knob('cov_fraction')}")
        if not self.knob("cov_low") < self.knob("cov_high"):
            raise ValueError(f"cov_low must be < cov_high, got cov_low={self.knob('cov_low')}, "
                             f"cov_high={self.knob('cov_high')}")

    def context(self, w, logp_new, logp_old, advantage) -> Any:
        cov = token_covariance(logp_new, advantage)
        kill = kill_mask(w, advantage, self.band.lo, self.band.hi)
        if self.band.dual_clip is not None:
            kill |= (advantage < 0) & (w > self.band.dual_clip)
        cand = ~kill & (cov > self.knob("cov_low")) & (cov < self.knob("cov_high"))
        return select_top(cov, cand, _count(self.knob("cov_fraction"), cov.numel()),
                          self.generator)

    def value(self, ratio, logp_new, logp_old, advantage, ctx):
        b = self.band
        obj = clip_objective(ratio, advantage, b.eps, b.eps_low, b.eps_high, b.dual_clip)
        return torch.where(ctx, torch.zeros_like(obj), obj)

    def coefficient(self, w, logp_new, logp_old, advantage, ctx):
        c = w * advantage + self._shape_beta(w, advantage, _CLIP)
        return torch.where(ctx, torch.zeros_like(c), c)


class KLCov(TemplateObjective):
    """KL-Cov (arXiv:2505.22617): ``w A`` everywhere, minus
    ``kl_cov_coef |log w|`` on the ``k`` tokens of largest covariance. The paper writes the
    penalty as ``beta D_KL(pi_old || pi)`` per token; its code (and klppo) uses ``|log w|``.
    ``c_t = w A - kl_cov_coef sgn(log w)`` on the selection (``sgn(0) = 0``, as autograd's),
    ``w A`` elsewhere. Paper: ``kl_cov_coef`` 1, ``cov_fraction`` 2e-3 (2e-4 for its 32B)."""

    name = "kl_cov"
    band_knobs = ()
    knobs = {"cov_fraction": 2e-3, "kl_cov_coef": 1.0}

    def _check_knobs(self) -> None:
        super()._check_knobs()
        if not self.knob("cov_fraction") <= 1:
            raise ValueError(f"cov_fraction must be in (0, 1], got {self.knob('cov_fraction')}")

    def context(self, w, logp_new, logp_old, advantage) -> Any:
        cov = token_covariance(logp_new, advantage)
        every = torch.ones_like(cov, dtype=torch.bool)
        return select_top(cov, every, _count(self.knob("cov_fraction"), cov.numel()))

    def value(self, ratio, logp_new, logp_old, advantage, ctx):
        pen = self.knob("kl_cov_coef") * (logp_new - logp_old).abs()
        return ratio * advantage - torch.where(ctx, pen, torch.zeros_like(pen))

    def coefficient(self, w, logp_new, logp_old, advantage, ctx):
        g = self.knob("kl_cov_coef") * torch.sign(logp_new - logp_old)
        return w * advantage - torch.where(ctx, g, torch.zeros_like(g))


#: the covariance-selected classes of this module
COVARIANCE = (ClipCov, KLCov)
