"""What klppo claims about each KL estimator x placement x correction, once, as data.

:data:`CLAIMS` says, for every combination of :mod:`klppo.core.kl_gradients`, which KL its
expected gradient is the gradient of: ``reverse`` (``KL(pi || pi_ref)``), ``forward``
(``KL(pi_ref || pi)``) or ``neither``. It is written by hand from the derivations below, not
from the enumeration; :func:`check_claims` compares the two (``klppo verify`` runs it and fails
on any disagreement), and :func:`gradient_warning` is what the RLHF loop tells a user who picks
a biased combination.

Derivations (``d = log pi - log pi_ref``, ``s = grad log pi``, ``E`` over ``pi``):

* reverse KL gradient ``E[d s]``; forward ``-E_ref[s] = E[(1 - e^-d) s]``;
* reward, on-policy: ``E[k s]``: only ``k1 = d`` gives ``E[d s]``; ``k3 = e^-d - 1 + d`` gives
  reverse minus forward; ``full`` (no dependence on the action) gives 0 for one action and,
  over sequences, only the effect of earlier tokens on later states' KL;
* loss, on-policy: ``E[k'(d) s]``: ``k1`` gives ``E[s] = 0``, ``k2`` ``E[d s]`` (reverse),
  ``k3`` ``E[(1 - e^-d) s]`` (forward; OpenRLHF #1309), ``full`` the exact per-state gradient.
  Per token over sequences, every one of them misses how a token changes the later states
  (Tang & Munos, arXiv:2506.09477), so only the sequence-level ``k2`` / ``k3`` keep their
  one-action answer;
* verl's straight-through ``k1+`` / ``k3+`` (the value of ``k1`` / ``k3``, the gradient of
  ``k2``): in the reward only the value counts (as ``k1`` / ``k3``); in the loss the gradient is
  ``k2``'s (reverse on-policy, one action or the sequence log-ratio; per token over sequences
  neither), and a differentiated ratio adds ``E[s k]`` of the value to it: neither;
* a detached ratio ``pi / mu`` on the per-sample gradient gives back the on-policy expectation
  exactly, whatever the estimator; no ratio gives neither (the samples are mu's);
* a differentiated ratio in the loss gives ``grad E_pi[K]``: reverse exactly for the estimators
  whose mean is the KL (``k1``, ``k3``, ``full``; arXiv:2505.17508, arXiv:2512.21852), also per
  token with the sequence ratio, but not with per-token ratios over sequences (the states are
  still mu's), nor with GSPO's length-normalised sequence ratio ``exp(mean_t log w_t)`` (not
  the sequence's ratio ``prod_t w_t``).
"""

from __future__ import annotations

from dataclasses import dataclass

from klppo.core.kl_gradients import (
    CORRECTIONS,
    ESTIMATOR_ALIASES,
    Combination,
    GradientTable,
    combinations,
)

__all__ = ["KLGradientWarning", "CLAIMS", "KL_NAMES", "claimed", "Mismatch", "check_claims",
           "unbiased", "gradient_warning"]


class KLGradientWarning(UserWarning):
    """A KL estimator, placement and correction whose expected gradient is not the gradient of
    ``KL(policy || reference)``."""


R, F, N, X = "reverse", "forward", "neither", None
#: what each verdict means, for messages
KL_NAMES = {R: "KL(policy || reference), the reverse KL",
            F: "KL(reference || policy), the forward KL",
            N: "neither KL(policy || reference) nor KL(reference || policy)"}

# columns: on_policy, ratio, ratio_grad, token_ratio_grad, none (X: does not apply)
_BIASED = (N, N, N, X, N)
_ONE_ACTION: dict[str, dict[str, tuple[str | None, ...]]] = {
    "reward": {"k1": (R, R, R, X, N), "k2": _BIASED, "k3": _BIASED, "abs": _BIASED,
               "k3_flipped": _BIASED, "tutorial": _BIASED, "full": _BIASED,
               "k1+": (R, R, R, X, N), "k3+": _BIASED},
    "loss": {"k1": (N, N, R, X, N), "k2": (R, R, N, X, N), "k3": (F, F, R, X, N),
             "abs": _BIASED, "k3_flipped": _BIASED, "tutorial": _BIASED,
             "full": (R, R, R, X, R), "k1+": (R, R, N, X, N), "k3+": (R, R, N, X, N)},
}
_TOKENS = (N, N, N, N, N)
_SEQUENCE: dict[tuple[str, str], dict[str, tuple[str | None, ...]]] = {
    ("reward", "token"): {"k1": (R, R, R, N, N), "k2": _TOKENS, "k3": _TOKENS, "abs": _TOKENS,
                          "k3_flipped": _TOKENS, "tutorial": _TOKENS, "full": _TOKENS,
                          "k1+": (R, R, R, N, N), "k3+": _TOKENS},
    ("reward", "sequence"): {"k1": (R, R, R, X, N), "k2": _BIASED, "k3": _BIASED,
                             "abs": _BIASED, "k3_flipped": _BIASED, "tutorial": _BIASED,
                             "k1+": (R, R, R, X, N), "k3+": _BIASED},
    ("loss", "token"): {"k1": (N, N, R, N, N), "k2": _TOKENS, "k3": (N, N, R, N, N),
                        "abs": _TOKENS, "k3_flipped": _TOKENS, "tutorial": _TOKENS,
                        "full": (N, N, R, N, N), "k1+": _TOKENS, "k3+": _TOKENS},
    ("loss", "sequence"): {"k1": (N, N, R, X, N), "k2": (R, R, N, X, N),
                           "k3": (F, F, R, X, N), "abs": _BIASED, "k3_flipped": _BIASED,
                           "tutorial": _BIASED, "k1+": (R, R, N, X, N),
                           "k3+": (R, R, N, X, N)},
}

#: (horizon, placement, granularity, estimator, correction) -> the KL the expected gradient is
#: the gradient of: "reverse", "forward" or "neither". Horizon 1 is one action (token and
#: sequence coincide); horizon 3 stands for any response longer than one token.
CLAIMS: dict[tuple[int, str, str, str, str], str] = {
    **{(1, place, "token", est, corr): v for place, rows in _ONE_ACTION.items()
       for est, row in rows.items() for corr, v in zip(CORRECTIONS, row) if v is not None},
    **{(3, place, gran, est, corr): v for (place, gran), rows in _SEQUENCE.items()
       for est, row in rows.items() for corr, v in zip(CORRECTIONS, row) if v is not None},
    # GSPO's length-normalised sequence ratio on per-token terms (TRL's use_bias_correction_kl
    # with importance_sampling_level="sequence"): the states are mu's and the weight is not the
    # sequence's ratio, so no estimator gets either KL's gradient
    **{(3, "loss", "token", est, "seq_mean_ratio_grad"): N for est in _SEQUENCE[("loss", "token")]},
}


def _key(c: Combination) -> tuple[int, str, str, str, str]:
    horizon = 1 if c.horizon == 1 else 3
    est = ESTIMATOR_ALIASES.get(c.estimator, c.estimator)
    return horizon, c.placement, c.granularity, est, c.correction


def claimed(c: Combination) -> str:
    """The claimed verdict of a combination (any horizon > 1 reads the 3-token claims)."""
    try:
        return CLAIMS[_key(c)]
    except KeyError:
        raise ValueError(f"no claim for {c.describe()} (it does not apply)") from None


@dataclass(frozen=True)
class Mismatch:
    """A cell where the claim and the enumeration disagree (or one of them is missing)."""

    combination: Combination
    claimed: str | None
    enumerated: str | None


def check_claims(table: GradientTable) -> list[Mismatch]:
    """Every cell whose enumerated verdict differs from :data:`CLAIMS`, and every claim or
    cell without a partner. Empty when the library's classification is right."""
    out = []
    seen = set()
    for cell in table.cells:
        key = _key(cell.combination)
        seen.add(key)
        want = CLAIMS.get(key)
        if want != cell.verdict:
            out.append(Mismatch(cell.combination, want, cell.verdict))
    enumerated_horizons = {c.combination.horizon for c in table.cells}
    for c in combinations(tuple(enumerated_horizons)):
        if _key(c) not in seen:
            out.append(Mismatch(c, CLAIMS.get(_key(c)), None))
    for key in CLAIMS.keys() - seen:
        if key[0] in enumerated_horizons:
            out.append(Mismatch(Combination(key[3], key[1], key[2], key[4], key[0]),
                                CLAIMS[key], None))
    return out


def unbiased(kl: str = R, horizon: int = 3) -> list[Combination]:
    """The combinations claimed unbiased for ``kl`` ("reverse" or "forward") at a horizon."""
    return [c for c in combinations((1 if horizon == 1 else 3,)) if claimed(c) == kl]


def gradient_warning(c: Combination) -> str | None:
    """None when the combination's expected gradient is that of ``KL(policy || reference)``;
    else one sentence naming it and the KL it descends (and, over sequences, what it descends
    per token where that differs)."""
    verdict = claimed(c)
    if verdict == R:
        return None
    msg = f"{c.describe()}: its expected gradient is that of {KL_NAMES[verdict]}"
    if c.horizon > 1 and c.granularity == "token" and c.correction != "token_ratio_grad":
        one = CLAIMS.get((1, c.placement, "token", c.estimator, c.correction))
        if one is not None and one != verdict:
            msg += f" (for a single token: {KL_NAMES[one]})"
    return msg
