"""The terms of one RLHF iteration, each testable alone: scores and log-probs at response
positions, the per-token KL to the reference, per-token rewards, and response diversity.

Prompt tokens and padding never enter the KL, the rewards or the loss: everything is computed on
response positions and masked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from klppo.core.kl import full_kl, sampled_kl
from klppo.lm.model import PolicyWithValue
from klppo.lm.sampling import token_logprobs

if TYPE_CHECKING:
    from klppo.lm.config import KLEstimatorLM

__all__ = ["score_sequences", "per_token_kl", "token_rewards", "distinct_n"]


def score_sequences(policy: PolicyWithValue, ref, prompts: torch.Tensor,
                    responses: torch.Tensor, grad: bool = False) -> dict[str, torch.Tensor]:
    """Full forward passes over prompt + response; everything at response positions only.

    Returns ``logp`` and ``values`` of the policy and ``logp_ref`` of the reference, each
    ``[B, R]`` (``values[:, t]`` is the value of the state before response token t), and the
    policy and reference logits ``[B, R, V]`` that predict the response tokens.
    """
    seq = torch.cat([prompts, responses], 1)
    P, R = prompts.shape[1], responses.shape[1]
    with torch.set_grad_enabled(grad):
        logits, values = policy(seq)
        logits = logits[:, P - 1:P - 1 + R]
        out = {"logp": token_logprobs(logits, responses), "values": values[:, P - 1:P - 1 + R],
               "logits": logits}
    if ref is not None:
        with torch.no_grad():
            ref_logits = ref(input_ids=seq).logits[:, P - 1:P - 1 + R]
            out["logits_ref"] = ref_logits
            out["logp_ref"] = token_logprobs(ref_logits, responses)
    return out


def per_token_kl(estimator: KLEstimatorLM, logp: torch.Tensor, logp_ref: torch.Tensor,
                 mask: torch.Tensor, logits: torch.Tensor | None = None,
                 logits_ref: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, R]`` per-token KL(policy || reference) on samples from the policy; 0 where
    ``mask`` is False. ``k1 = logp - logp_ref``; ``k3`` the unbiased non-negative form;
    ``full`` the exact KL over the vocabulary at each position."""
    if estimator == "full":
        assert logits is not None and logits_ref is not None, "the full KL needs the logits"
        kl = full_kl(logits, logits_ref, mask=mask)
    else:  # padded positions may hold anything: they are replaced before the estimator runs
        zero = torch.zeros((), dtype=logp.dtype)
        kl = sampled_kl(torch.where(mask, logp, zero), torch.where(mask, logp_ref, zero),
                        estimator)
    return torch.where(mask, kl, torch.zeros((), dtype=kl.dtype))


def token_rewards(kl: torch.Tensor, score: torch.Tensor, mask: torch.Tensor, beta: float,
                  in_reward: bool) -> torch.Tensor:
    """``r_t = -beta KL_t`` at every response token (if ``in_reward``) plus the task score at
    the last real token; 0 at padding."""
    r = -beta * kl if in_reward else torch.zeros_like(kl)
    last = mask.long().sum(1) - 1
    r = r.clone()
    r[torch.arange(len(score)), last] += score
    return torch.where(mask, r, torch.zeros((), dtype=r.dtype))


def distinct_n(token_rows: list[list[int]], n: int = 2) -> float:
    """Distinct-n: unique n-grams / all n-grams over the responses (diversity; 1 = no repeats)."""
    grams, total = set(), 0
    for row in token_rows:
        for i in range(len(row) - n + 1):
            grams.add(tuple(row[i:i + n]))
            total += 1
    return len(grams) / total if total else 0.0
