"""Sequence-level trust regions: objectives that need to know which tokens form one sequence.

Their ``term`` takes the tokens of a minibatch flattened (``[N]``, the language-model loop's
response tokens) and ``sequence_ids`` (``[N]`` int: the sequence of each token). A Gymnasium
sample is no sequence, so the Gymnasium trainer refuses these (``level == "sequence"``).

Aggregation: :class:`~klppo.core.loss.PPOLoss` takes the mean over the ``N`` tokens. GSPO and
GMPO are defined as a mean over sequences (of a per-sequence quantity, or of each sequence's
token mean), so their per-token values carry the weight ``N / (S L_i)`` (``S`` sequences, ``L_i``
tokens in sequence ``i``): the token mean is then exactly the paper's sequence mean, whatever
the lengths (with equal lengths the weight is 1). Trust-region masking is a mask on a
token-level surrogate and keeps the token mean.

``c_t`` is again the detached coefficient of ``grad logp_new``; ``beta_t = c_t - w_t A_t``.
Segment sums and maxima use a ``[S, N]`` one-hot matrix (deterministic on every device).
"""

from __future__ import annotations

from typing import Any, ClassVar

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
    Objective,
    PolicyTerm,
    ShapeSpec,
)
from klppo.core.surrogates import clip_objective

__all__ = ["Segments", "SequenceObjective", "GSPO", "GMPO", "TrustRegionMasking", "TOPR"]


class Segments:
    """Which of ``N`` flattened tokens belong to which of ``S`` sequences, with segment means,
    maxima and the weight ``N / (S L_i)`` per token (sequences without tokens do not count)."""

    def __init__(self, sequence_ids: torch.Tensor) -> None:
        ids = torch.as_tensor(sequence_ids).reshape(-1).long()
        if ids.numel() == 0 or bool((ids < 0).any()):
            raise ValueError("sequence_ids must be a non-empty tensor of ids >= 0")
        ids = torch.unique(ids, return_inverse=True)[1]  # 0..S-1, in order of first id
        self.ids = ids
        self.num = int(ids.max()) + 1
        #: every token its own sequence (klppo train's steps): the segment sums, means and
        #: maxima are the tokens themselves, gathered, without the ``[S, N]`` one-hot matrix
        self.singletons = self.num == ids.numel()
        self._token_of = torch.argsort(ids) if self.singletons else None
        self._onehot: torch.Tensor | None = None
        self.length = (torch.ones(self.num, dtype=torch.long, device=ids.device)
                       if self.singletons else self.onehot.sum(1))

    @property
    def onehot(self) -> torch.Tensor:
        """``[S, N]`` bool: token n belongs to sequence s (made on first use)."""
        if self._onehot is None:
            ids = self.ids
            self._onehot = ids[None, :] == torch.arange(self.num, device=ids.device)[:, None]
        return self._onehot

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        """``[S]`` sum of ``x`` ``[N]`` over each sequence."""
        if self._token_of is not None:
            return x[self._token_of]
        return self.onehot.to(x.dtype) @ x

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        """``[S]`` mean of ``x`` ``[N]`` over each sequence."""
        if self._token_of is not None:
            return x[self._token_of]
        return self.sum(x) / self.length.to(x.dtype)

    def max(self, x: torch.Tensor) -> torch.Tensor:
        """``[S]`` maximum of ``x`` over each sequence."""
        if self._token_of is not None:
            return x[self._token_of]
        low = torch.full((), -torch.inf, dtype=x.dtype, device=x.device)
        return torch.where(self.onehot, x[None, :], low).amax(1)

    def weight(self, dtype: torch.dtype) -> torch.Tensor:
        """``[N]`` per-token weight ``N / (S L_i)``: a token mean of ``weight * x`` is the mean
        over sequences of each sequence's token mean of ``x``."""
        n = self.ids.numel()
        return (n / (self.num * self.length.to(dtype)))[self.ids]


class SequenceObjective(Objective):
    """Base of the sequence-level objectives: ``term`` needs ``sequence_ids``; no numpy closed
    form (the fast path serves Gymnasium samples, which are no sequences).

    ``paper_band``: the band the objective's paper uses, taken when the band given is klppo's
    default (``eps`` 0.2, no edges): a sequence ratio or a log-space radius does not live on the
    token ratio's scale, so 0.2 would mean another method. Any other band is taken as given
    (``eps_low=0.2, eps_high=0.2`` for a symmetric 0.2)."""

    level = "sequence"
    paper_band: ClassVar[Band | None] = None
    #: whether it means something with sequences of one sample (``klppo train`` runs it with
    #: each step its own sequence); the others then reduce to a token-level objective
    one_step: ClassVar[bool] = False

    def __init__(self, band: Band = DEFAULT_BAND, shape: ShapeSpec = DEFAULT_SHAPE,
                 kl_estimator: str = "analytic", knobs: Knobs = NO_KNOBS) -> None:
        if self.paper_band is not None and band.is_scalar and band == DEFAULT_BAND:
            band = self.paper_band
        super().__init__(band, shape, kl_estimator, knobs)

    def term(self, ratio, logp_new, logp_old, advantage, kl, beta, want_beta=True,
             sequence_ids=None):
        if sequence_ids is None:
            raise ValueError(f"objective {self.name!r} is sequence-level: pass sequence_ids "
                             "(the sequence of each token)")
        seg = Segments(sequence_ids.to(ratio.device))
        if seg.ids.shape != ratio.reshape(-1).shape or ratio.dim() != 1:
            raise ValueError(f"sequence_ids must have the tokens' shape [N], got "
                             f"{tuple(sequence_ids.shape)} for {tuple(ratio.shape)}")
        obj, coef = self.sequence_term(ratio, logp_new, logp_old, advantage, seg)
        bt = coef - ratio.detach() * advantage if want_beta else None
        return PolicyTerm(obj, bt, None)

    def sequence_term(self, ratio, logp_new, logp_old, advantage,
                      seg: Segments) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token values (with gradient) and the detached coefficients ``c_t``."""
        raise NotImplementedError


class GSPO(SequenceObjective):
    """GSPO (Qwen, Zheng et al. 2025, arXiv:2507.18071): the sequence ratio
    ``s_i = exp(mean_t log w_t)`` clipped at the sequence level,
    ``J = mean_i min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)`` (the paper's eps
    3e-4 / 4e-4: the default band). With a per-token advantage klppo uses the paper's
    GSPO-token form,
    ``s_{i,t} = sg(s_i) w_t / sg(w_t)``, ``mean_i mean_t min(s_{i,t} A_t, clip(s_{i,t}) A_t)``,
    equal to GSPO in value and gradient when ``A`` is constant over each sequence.
    ``c_t = (N / (S L_i)) s_i A_t 1[not kill(s_i, A_t)]``."""

    name = "gspo"
    band_knobs = ("eps_low", "eps_high")
    paper_band = Band(eps_low=3e-4, eps_high=4e-4)

    def sequence_term(self, ratio, logp_new, logp_old, advantage, seg):
        b = self.band
        log_w = logp_new - logp_old
        log_s = seg.mean(log_w.detach())[seg.ids]
        s_tok = torch.exp(log_s + log_w - log_w.detach())
        weight = seg.weight(ratio.dtype)
        obj = weight * clip_objective(s_tok, advantage, b.eps, b.eps_low, b.eps_high)
        s = s_tok.detach()
        keep = ~kill_mask(s, advantage, b.lo, b.hi)
        coef = torch.where(keep, weight * s * advantage, torch.zeros_like(s))
        return obj, coef


class GMPO(SequenceObjective):
    """GMPO (Zhao et al. 2025, arXiv:2507.20673): the geometric mean of the token ratios,
    clipped per token in log space, ``J = mean_i A_i exp(mean_t m_t)`` with
    ``m_t = sgn(A) min(sgn(A) log w_t, sgn(A) clip(log w_t, -eps_low, eps_high))`` (the band's
    radii are log-space here; the paper's 0.4 on both sides: the default band). With a
    per-token advantage klppo uses
    the same construction per token (``A_t`` and its sign in place of ``A_i``; the geometric
    mean is still over the sequence), equal to GMPO when ``A`` is constant over each sequence.
    ``c_t = (N / (S L_i)) A_t G_i 1[not kill_t]`` with ``G_i = exp(mean_t m_t)`` and kill
    ``log w_t > eps_high, A_t > 0`` or ``log w_t < -eps_low, A_t < 0``."""

    name = "gmpo"
    band_knobs = ("eps_low", "eps_high")
    paper_band = Band(eps=0.4)

    def sequence_term(self, ratio, logp_new, logp_old, advantage, seg):
        log_w = logp_new - logp_old
        sgn = torch.sign(advantage)
        lo, hi = self.band.lo, self.band.hi
        clipped = torch.clamp(log_w, -torch.as_tensor(lo, dtype=log_w.dtype, device=log_w.device),
                              torch.as_tensor(hi, dtype=log_w.dtype, device=log_w.device))
        m = sgn * torch.min(sgn * log_w, sgn * clipped)
        log_g = seg.mean(m.detach())[seg.ids]
        weight = seg.weight(ratio.dtype)
        obj = weight * advantage * torch.exp(log_g + m - m.detach())
        lw = log_w.detach()
        kill = ((lw > hi) & (advantage > 0)) | ((lw < -lo) & (advantage < 0))
        coef = torch.where(kill, torch.zeros_like(lw), weight * advantage * torch.exp(log_g))
        return obj, coef


class TrustRegionMasking(SequenceObjective):
    """Trust-region masking (Li et al. 2025, arXiv:2512.23075): a whole sequence leaves the
    gradient when its largest token divergence exceeds ``delta``:
    ``M_i = 1[max_t k2_t <= delta]`` with the sampled ``k2 = (log w)^2 / 2`` (nats per token,
    symmetric; the max criterion's estimator as slime's implementation of the paper reads it),
    times the token-level PPO-Clip surrogate (the band; a large ``eps`` gives the paper's
    masked ``M_i w A``). ``c_t = M_i (w A + beta_t^clip)``. klppo's default delta 0.05 is not
    from the paper."""

    name = "trm"
    band_knobs = BAND_KNOBS
    knobs = {"delta": 0.05}

    def sequence_term(self, ratio, logp_new, logp_old, advantage, seg):
        b = self.band
        lw = (logp_new - logp_old).detach()
        keep = (seg.max(lw * lw / 2) <= self.knob("delta"))[seg.ids]
        obj = clip_objective(ratio, advantage, b.eps, b.eps_low, b.eps_high, b.dual_clip)
        w = ratio.detach()
        c = w * advantage + self._shape_beta(w, advantage, _CLIP)
        zero = torch.zeros_like(c)
        return torch.where(keep, obj, zero), torch.where(keep, c, zero)


class TOPR(SequenceObjective):
    """TOPR, tapered off-policy REINFORCE (Le Roux et al. 2025, arXiv:2503.14286): for stale or
    off-policy samples, REINFORCE with no importance weight where the return is at least 0 and
    the truncated trajectory ratio ``min(rho_i, 1)``, ``rho_i = pi(y_i) / mu(y_i) = exp(sum_t
    log w_t)``, where it is below 0:
    ``J = (1/S) sum_i sg(a_i) A_i log pi(y_i)``, ``a_i = 1`` if ``A_i >= 0`` else
    ``min(rho_i, 1)``; ``log pi(y_i)`` sums the tokens' (the paper's REINFORCE: no ``1/L_i``).
    No band: positive samples are never clipped, and negative ones can only be down-weighted.
    With a per-token advantage klppo takes each token's sign and ``A_t`` (the trajectory ratio
    is still the response's), equal to TOPR when ``A`` is constant over each sequence.
    ``c_t = (N / S) a_{i,t} A_t``. ``logp_old`` is the sampling policy's (``ratio_to_sampler``:
    ``klppo rlhf`` passes the stale or lower-precision sampler's log-probabilities)."""

    name = "topr"
    band_knobs = ()
    ratio_to_sampler = True
    one_step = True  # klppo train: each step a sequence, a_t = min(pi / mu, 1) where A_t < 0

    def sequence_term(self, ratio, logp_new, logp_old, advantage, seg):
        log_rho = seg.sum((logp_new - logp_old).detach())[seg.ids]
        taper = torch.where(advantage >= 0, torch.ones_like(log_rho),
                            torch.exp(torch.clamp(log_rho, max=0.0)))
        weight = seg.ids.numel() / seg.num
        coef = weight * taper * advantage.detach()
        return coef * logp_new, coef


#: the sequence-level classes of this module
SEQUENCE_LEVEL: tuple[Any, ...] = (GSPO, GMPO, TrustRegionMasking, TOPR)
