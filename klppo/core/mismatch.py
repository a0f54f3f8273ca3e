"""Training-inference mismatch: importance weights from the rollout policy to the trained one.

The policy that samples (an inference engine in bfloat16, vLLM; or, with stale rollouts, the
policy some updates back: the *behaviour* policy ``mu``) and the policy that is trained give the
same tokens different probabilities. PPO's ratio is taken against the trained policy's
log-probabilities before the update (``pi_old``, decoupled PPO's *proximal* policy), so the
samples come from another distribution than the one the ratio assumes; per token the correction
is ``rho_t = pi_old(y_t) / mu(y_t)``, detached, multiplying the token's objective
(:class:`klppo.core.loss.PPOLoss` ``sample_weight``). Without truncation or masking the weighted
objective's expected gradient is the on-policy one (checked by exact enumeration in the tests).
The corrections, with their sources' defaults and where klppo departs from a source:

* ``tis``: truncated importance sampling per token, ``min(rho_t, upper)``, upper 2 (Yao et al.
  2025, "Your efficient RL framework secretly brings you off-policy RL training", and verl's token
  TIS). Hilton et al.'s decoupled PPO (2021) uses the untruncated ``rho_t``: a large ``upper``
  gives it.
* ``seq_tis``: truncated importance sampling per response, ``min(prod_t rho_t, upper)`` on every
  token of the response, upper 2 (verl's ``rollout_is: sequence``, threshold 2).
* ``mis``: masked importance sampling over the response, ``rho = prod_t rho_t`` kept as the
  weight of every token when ``rho <= upper`` (2), the whole response masked (0) otherwise (Liu
  et al. 2025, "When speed kills stability"). One-sided by default; with ``lower`` the response is
  also masked when ``rho < lower`` (two-sided, as verl's sequence rejection preset, 0.5-2).
  TRL's own default (``vllm_importance_sampling_mode``) masks at 3 and is not this one.
* ``icepop``: ``rho_t`` where ``lower <= rho_t <= upper`` (0.5, 5), 0 outside (the Ring-1T
  report, 2025; verl's ``token_icepop``);
* ``m2po``: the second-moment trust region for stale rollouts (Zheng et al. 2025, "Prosperity
  before collapse", arXiv:2510.01161; AReaL's ``m2_threshold``): the behaviour weight ``rho_t``,
  except on the tokens of largest ``(log rho_t)^2``, masked (0) one by one until the mean of
  ``(log rho_t)^2`` over the tokens kept is at most ``upper`` (0.04). With ``reject`` a token whose
  ``rho_t`` is above it is also masked (AReaL's ``behav_imp_weight_cap``; off by default, as in
  AReaL). The paper pairs it with the unclipped objective (``objective=unclipped``);
* ``none``: weight 1 (the mismatch is measured, not corrected).

With a stale sampler (``staleness`` k) ``tis`` with a large upper bound is decoupled PPO
(Hilton et al. 2021; AReaL's ``use_decoupled_loss``): the clip taken against the proximal policy
and each token weighted by the behaviour ratio.

Log-ratios are clamped to [-20, 20] before ``exp`` (a ratio of e^20 is masked or truncated by
every correction anyway).
"""

from __future__ import annotations

from typing import get_args

import torch

from klppo.core.kl import per_sequence_sum
from klppo.core.names import MismatchCorrection

__all__ = ["MismatchCorrection", "MISMATCH_CORRECTIONS", "DEFAULT_BOUNDS", "mismatch_weights",
           "mismatch_stats", "bounds_problem"]

MISMATCH_CORRECTIONS: tuple[str, ...] = get_args(MismatchCorrection)
#: (lower, upper) of each correction (a lower bound: icepop, and mis when two-sided)
DEFAULT_BOUNDS: dict[str, tuple[float | None, float | None]] = {
    "none": (None, None), "tis": (None, 2.0), "seq_tis": (None, 2.0), "mis": (None, 2.0),
    "icepop": (0.5, 5.0), "m2po": (None, 0.04)}
#: the corrections that read a lower bound
_READS_LOWER = ("icepop", "mis")
_SAFE = 20.0


def bounds_problem(correction: str, upper: float | None, lower: float | None,
                   reject: float | None = None) -> tuple[str, float, str] | None:
    """What is wrong with a correction's bounds, as ``(which: "upper", "lower" or "reject",
    value, why)``, or None: a bound the correction does not read, a lower bound not below the
    upper one, or an m2po rejection bound not above 1."""
    if correction == "none":
        for which, v in (("upper", upper), ("lower", lower), ("reject", reject)):
            if v is not None:
                return which, v, "only a mismatch correction reads it"
        return None
    if lower is not None and correction not in _READS_LOWER:
        return "lower", lower, "only the icepop and mis corrections read it"
    if reject is not None and correction != "m2po":
        return "reject", reject, "only the m2po correction reads it"
    if reject is not None and not reject > 1.0:
        return "reject", reject, "must be above 1 (a ratio rejected above it; AReaL's cap)"
    if correction not in _READS_LOWER:
        return None
    lo_default, hi_default = DEFAULT_BOUNDS[correction]
    lo = lo_default if lower is None else lower
    hi = hi_default if upper is None else upper
    assert hi is not None  # (both read an upper bound)
    if lo is not None and not lo < hi:
        if upper is None:
            return "lower", lo, f"must be below the upper bound {hi}"
        return "upper", hi, f"must be above the lower bound {lo}"
    return None


def mismatch_weights(log_ratio: torch.Tensor, mask: torch.Tensor, correction: str,
                     upper: float | None = None, lower: float | None = None,
                     reject: float | None = None) -> torch.Tensor:
    """``[B, T]`` detached weights (0 on padding) from ``log_ratio = log pi_old - log
    pi_rollout`` per token; ``upper`` / ``lower`` default to :data:`DEFAULT_BOUNDS`;
    ``reject`` (m2po only): tokens whose ratio is above it weigh 0."""
    if correction not in DEFAULT_BOUNDS:
        raise ValueError(f"correction must be one of {', '.join(MISMATCH_CORRECTIONS)}, got "
                         f"correction={correction!r}")
    lo_default, hi_default = DEFAULT_BOUNDS[correction]
    hi = float(hi_default or 0.0) if upper is None else upper
    lo = lo_default if lower is None else lower
    m = mask.bool()
    lr = torch.where(m, log_ratio.detach(), torch.zeros_like(log_ratio)).clamp(-_SAFE, _SAFE)
    rho = torch.exp(lr)
    if correction == "none":
        w = torch.ones_like(lr)
    elif correction == "tis":
        w = rho.clamp(max=hi)
    elif correction in ("seq_tis", "mis"):
        w = _sequence_weight(lr, m, correction, hi, lo)[:, None].expand_as(lr)
    elif correction == "icepop":
        assert lo is not None  # (IcePop's default lower bound is a number)
        w = torch.where((rho >= lo) & (rho <= hi), rho, torch.zeros_like(rho))
    else:  # m2po: the behaviour weight on the tokens its second-moment mask keeps
        w = _second_moment_mask(lr, m, hi) * rho
        if reject is not None:
            w = torch.where(rho <= reject, w, torch.zeros_like(w))
    return torch.where(m, w, torch.zeros_like(w))


def _sequence_weight(lr: torch.Tensor, m: torch.Tensor, correction: str, hi: float,
                     lo: float | None) -> torch.Tensor:
    """``[B]``: the response's ratio ``prod_t rho_t``, truncated at ``hi`` (seq_tis) or
    kept where it lies in ``[lo, hi]`` and 0 outside (mis; no lower bound when ``lo`` is None)."""
    rho = torch.exp(per_sequence_sum(lr, m).clamp(-_SAFE, _SAFE))
    if correction == "seq_tis":
        return rho.clamp(max=hi)
    keep = rho <= hi
    if lo is not None:
        keep = keep & (rho >= lo)
    return torch.where(keep, rho, torch.zeros_like(rho))


def _second_moment_mask(lr: torch.Tensor, m: torch.Tensor, tau: float) -> torch.Tensor:
    """1 on the valid tokens kept, 0 on the fewest largest-``(log rho)^2`` tokens whose removal
    brings the kept tokens' mean of ``(log rho)^2`` to at most ``tau``."""
    m2 = (lr * lr)[m].double()
    n = m2.numel()
    order = torch.argsort(m2, descending=True, stable=True)
    removed = torch.cat([m2.new_zeros(1), torch.cumsum(m2[order], 0)])  # removed[d]: top d
    kept = torch.arange(n, -1, -1, dtype=m2.dtype)  # n - d tokens left
    ok = (m2.sum() - removed <= tau * kept) & (kept > 0)
    d = int(torch.nonzero(ok)[0]) if bool(ok.any()) else n
    keep = torch.ones(n, dtype=lr.dtype)
    keep[order[:d]] = 0
    out = torch.zeros_like(lr)
    out[m] = keep
    return out


def mismatch_stats(log_ratio: torch.Tensor, mask: torch.Tensor,
                   weights: torch.Tensor) -> dict[str, float]:
    """The mismatch's size and what the correction did, over the valid tokens of ``[B, T]``
    ``log_ratio = log pi_old - log mu`` (``mu`` the rollout policy, which sampled the tokens).

    Per token (nats per token, of KL(mu || pi_old), sampled under ``mu``): ``mismatch_kl_k1``
    (the mean of ``-log rho``), ``mismatch_kl_k2`` (of ``(log rho)^2 / 2``), ``mismatch_kl_k3``
    (of ``rho - 1 - log rho``); ``mismatch_chi2_token`` (``E[rho^2] - 1``, the chi-square
    divergence of pi_old from mu per token) and ``mismatch_chi2_seq`` (the same of the
    responses' ratios ``prod_t rho_t``); ``mismatch_ppl_ratio`` (the mean over responses of
    pi_old's perplexity over mu's, ``exp(-mean_t log rho_t)``); ``mismatch_ratio_max`` and
    ``mismatch_ratio_min``. Of the correction's weights: ``mismatch_weight_mean``,
    ``mismatch_zeroed`` (the fraction of tokens weighted 0) and ``mismatch_ess`` (the effective
    sample size as a fraction, ``mean(w)^2 / mean(w^2)``; 0 when every weight is 0)."""
    m = mask.bool()
    lr_all = torch.where(m, log_ratio.detach(), torch.zeros_like(log_ratio)).double()
    lr_all = lr_all.clamp(-_SAFE, _SAFE)
    lr = lr_all[m]
    w = weights.detach()[m].double()
    rho = torch.exp(lr)
    valid = m.sum(-1) > 0
    seq_lr = per_sequence_sum(lr_all, m)[valid].clamp(-_SAFE, _SAFE)
    seq_mean = seq_lr / m.sum(-1)[valid]
    w2 = float((w * w).mean())
    return {"mismatch_kl_k1": float((-lr).mean()),
            "mismatch_kl_k2": float((0.5 * lr * lr).mean()),
            "mismatch_kl_k3": float((rho - 1 - lr).mean()),
            "mismatch_chi2_token": float((rho * rho).mean() - 1),
            "mismatch_chi2_seq": float(torch.exp(2 * seq_lr).mean() - 1),
            "mismatch_ppl_ratio": float(torch.exp(-seq_mean).mean()),
            "mismatch_ratio_max": float(rho.max()),
            "mismatch_ratio_min": float(rho.min()),
            "mismatch_weight_mean": float(w.mean()),
            "mismatch_zeroed": float((w == 0).double().mean()),
            "mismatch_ess": float(w.mean()) ** 2 / w2 if w2 > 0 else 0.0}
