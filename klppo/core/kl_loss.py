"""The KL to the reference as a term of the loss, per sequence, in four forms.

A KL penalty in the loss (GRPO's placement) is differentiated through ``log pi``. Which KL its
expected gradient descends depends on the estimator, its granularity and the importance
correction (:mod:`klppo.core.kl_gradients`, ``klppo verify``). Per token over sequences, every
estimator misses how a token changes the later states, so per-token forms descend neither KL;
two forms the exact enumeration finds unbiased for ``KL(pi || pi_ref)`` over whole sequences:

* ``k2_sequence``: ``sg(w) * (D^2 / 2)`` with ``D = sum_t (log pi_t - log pi_ref_t)`` the
  sequence log-ratio and ``w = pi(y) / pi_old(y)`` the sequence's importance ratio, detached
  (1 on the first pass over a batch): ``E_pi[D grad log pi(y)]`` is the reverse KL's gradient
  (the cells "k2 in the loss, on the sequence log-ratio, on-policy / detached ratio");
* ``k3_ratio``: ``w * sum_t k3_t`` with ``w`` differentiated: ``grad E_pi[sum_t k3_t]``, the
  gradient of the reverse KL because ``k3``'s mean is the KL (the cell "k3 in the loss, per
  token, differentiated ratio"; arXiv:2505.17508, arXiv:2512.21852);
* ``k3``: ``sum_t k3_t`` (GRPO's and TRL's form without the ratio): per token the forward KL
  on-policy, over sequences neither.

The two exact forms pay for exactness with a ratio over the whole response (a product of its
tokens' ratios): after the first epoch over a batch it is far from 1 and its variance grows with
the length (``k2_sequence`` diverged with 4 epochs on the Austen loop). A third form keeps the
per-token ratio PPO's surrogate uses:

* ``k1_to_go`` (the default): ``sum_t w_t sg(G_t - b_t)``, ``w_t = pi_t / pi_old_t``
  differentiated, ``G_t = sum_{s >= t} d_s`` the KL still to come in the response and ``b_t``
  the mean ``G_t`` of the other responses passed (leave-one-out: independent of the response,
  so it changes the variance, not the expectation), both detached. Its gradient is
  what ``k1`` in the rewards gives PPO (the KL credited through returns-to-go, the cell "k1 in
  the reward, per token": on-policy / per-token ratio), here as a term of the loss beside the
  objective: on the first pass over a batch exactly the reverse KL's gradient over whole
  responses; on later passes the per-token ratio leaves the change of the states uncorrected,
  the same first-order approximation as PPO's surrogate, with the variance of one token's ratio.
  Its value is ``D = sum_t d_t`` (the ``k1`` estimate of the KL, nats per sequence); the
  gradient rides on a term whose value is 0.

Each returns one value per sequence (nats per sequence; ``k2_sequence``'s mean is the KL only
to second order). ``w`` can be large when ``pi`` has moved far from ``pi_old``: it is the exact
correction, not a clipped one.
"""

from __future__ import annotations

from typing import get_args

import torch

from klppo.core.kl import ESTIMATORS, per_sequence_sum
from klppo.core.names import KLLossForm

__all__ = ["KLLossForm", "KL_LOSS_FORMS", "kl_loss_terms", "kl_loss_combination"]

KL_LOSS_FORMS: tuple[str, ...] = get_args(KLLossForm)


def kl_loss_terms(form: str, logp: torch.Tensor, logp_ref: torch.Tensor,
                  logp_old: torch.Tensor, mask: torch.Tensor | None = None, *,
                  baseline: bool = True) -> torch.Tensor:
    """``[B]`` per-sequence KL terms of ``[B, T]`` token log-probabilities under the policy
    (with gradient), the reference and the sampling policy, over the valid tokens of ``mask``.
    ``baseline`` (``k1_to_go`` only): subtract from each ``G_t`` the mean of the other
    responses' at the same position (leave-one-out; 0 when no other response has a token
    there). The responses must then be independent draws: the exact enumeration, which weights
    every sequence instead of drawing, passes False."""
    d = logp - logp_ref
    if form == "k1_to_go":
        return _k1_to_go(d, logp - logp_old.detach(), mask, baseline)
    if form == "k2_sequence":
        big_d = per_sequence_sum(d, mask)
        w = torch.exp(per_sequence_sum(logp - logp_old, mask)).detach()
        return w * 0.5 * big_d * big_d
    k3 = per_sequence_sum(ESTIMATORS["k3"](-d), mask)
    if form == "k3_ratio":
        return torch.exp(per_sequence_sum(logp - logp_old.detach(), mask)) * k3
    if form == "k3":
        return k3
    raise ValueError(f"kl_loss must be one of {', '.join(KL_LOSS_FORMS)}, got kl_loss={form!r}")


def _k1_to_go(d: torch.Tensor, log_w: torch.Tensor, mask: torch.Tensor | None,
              baseline: bool) -> torch.Tensor:
    """``sum_t w_t sg(G_t - b_t)`` with the gradient of that and the value ``sum_t d_t``."""
    valid = torch.ones_like(d) if mask is None else mask.to(d.dtype)
    d, log_w = (d * valid).detach(), log_w * valid
    to_go = d.flip(-1).cumsum(-1).flip(-1)  # G_t = sum_{s >= t} d_s
    if baseline:  # b_t: the other responses' mean G_t (independent of this one: no bias)
        others = valid.sum(0) - valid
        b = ((to_go * valid).sum(0) - to_go * valid) / others.clamp(min=1)
        to_go = (to_go - torch.where(others > 0, b, torch.zeros_like(b))) * valid
    w = torch.exp(log_w)
    return ((w - w.detach()) * to_go).sum(-1) + d.sum(-1)


def kl_loss_combination(form: str, first_pass: bool = True) -> tuple[str, str, str, str]:
    """``(estimator, placement, granularity, correction)`` of the form in
    :mod:`klppo.core.kl_gradients` on the first pass over a batch or on a later one: placement
    ``loss`` (the estimate differentiated) except for ``k1_to_go``, whose gradient is the
    score-function term of ``k1`` in the rewards (placement ``reward``)."""
    if form == "k1_to_go":
        return "k1", "reward", "token", "on_policy" if first_pass else "token_ratio_grad"
    if form == "k2_sequence":
        return "k2", "loss", "sequence", "on_policy" if first_pass else "ratio"
    if form == "k3_ratio":
        return "k3", "loss", "token", "ratio_grad"
    if form == "k3":
        return "k3", "loss", "token", "on_policy" if first_pass else "none"
    raise ValueError(f"kl_loss must be one of {', '.join(KL_LOSS_FORMS)}, got kl_loss={form!r}")
