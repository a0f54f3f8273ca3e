"""Training-inference mismatch: importance weights from the rollout policy to the trained one.

The policy that samples (an inference engine in bfloat16, vLLM) and the policy that is trained
(float32) give the same tokens slightly different probabilities. PPO's ratio is taken against
the trained policy's log-probabilities before the update (``logp_old``), so the samples come from
another distribution than the one PPO assumes; per token the correction is
``rho_t = pi_old(y_t) / pi_rollout(y_t)``, detached, multiplying the token's objective
(:class:`klppo.core.loss.PPOLoss` ``sample_weight``). The corrections in use, with their
sources' defaults:

* ``tis``: truncated importance sampling, ``min(rho_t, upper)``, upper 2 (Yao et al. 2025,
  "Your efficient RL framework secretly brings you off-policy RL training"; verl's token TIS);
* ``mis``: masked importance sampling over the response, ``rho = prod_t rho_t`` kept as the
  weight of every token when ``rho <= upper`` (2), the whole response masked (0) otherwise (Liu
  et al. 2025, "When speed kills stability"; verl's sequence IS with rejection);
* ``icepop``: ``rho_t`` where ``lower <= rho_t <= upper`` (0.5, 5), 0 outside (the Ring-1T
  report, 2025; verl's ``token_icepop``);
* ``m2po``: the second-moment trust region for stale rollouts (Zheng et al. 2025, "Prosperity
  before collapse", arXiv:2510.01161; AReaL's ``m2_threshold``): weight 1, except the tokens of
  largest ``(log rho_t)^2``, masked (0) one by one until the mean of ``(log rho_t)^2`` over the
  tokens kept is at most ``upper`` (0.04). The paper pairs it with the unclipped objective
  (``objective=unclipped``);
* ``none``: weight 1 (the mismatch is measured, not corrected).

The same weights serve a stale sampler (``staleness`` k: the policy k updates back samples):
with ``tis`` that is decoupled PPO (Hilton et al. 2021; AReaL), the clip taken against the
proximal policy (the one before the update) and the behaviour ratio truncated.

Log-ratios are clamped to [-20, 20] before ``exp`` (a ratio of e^20 is masked or truncated by
every correction anyway).
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

from klppo.core.kl import per_sequence_sum

__all__ = ["MismatchCorrection", "MISMATCH_CORRECTIONS", "DEFAULT_BOUNDS", "mismatch_weights",
           "mismatch_stats", "bounds_problem"]

MismatchCorrection = Literal["none", "tis", "mis", "icepop", "m2po"]
MISMATCH_CORRECTIONS: tuple[str, ...] = get_args(MismatchCorrection)
#: (lower, upper) of each correction (lower: IcePop only)
DEFAULT_BOUNDS: dict[str, tuple[float | None, float | None]] = {
    "none": (None, None), "tis": (None, 2.0), "mis": (None, 2.0), "icepop": (0.5, 5.0),
    "m2po": (None, 0.04)}
_SAFE = 20.0


def bounds_problem(correction: str, upper: float | None, lower: float | None
                   ) -> tuple[str, float, str] | None:
    """What is wrong with a correction's bounds, as ``(which: "upper" or "lower", value,
    why)``, or None: a bound the correction does not read, or IcePop's lower bound not below
    its upper one."""
    if correction == "none":
        for which, v in (("upper", upper), ("lower", lower)):
            if v is not None:
                return which, v, "only a mismatch correction reads it"
        return None
    if lower is not None and correction != "icepop":
        return "lower", lower, "only the icepop correction reads it"
    if correction != "icepop":
        return None
    lo_default, hi_default = DEFAULT_BOUNDS["icepop"]
    lo = lo_default if lower is None else lower
    hi = hi_default if upper is None else upper
    assert lo is not None and hi is not None  # (IcePop's defaults are numbers)
    if not lo < hi:
        if upper is None:
            return "lower", lo, f"must be below the upper bound {hi}"
        return "upper", hi, f"must be above the lower bound {lo}"
    return None


def mismatch_weights(log_ratio: torch.Tensor, mask: torch.Tensor, correction: str,
                     upper: float | None = None, lower: float | None = None) -> torch.Tensor:
    """``[B, T]`` detached weights (0 on padding) from ``log_ratio = log pi_old - log
    pi_rollout`` per token; ``upper`` / ``lower`` default to :data:`DEFAULT_BOUNDS`."""
    if correction not in DEFAULT_BOUNDS:
        raise ValueError(f"correction must be one of {', '.join(MISMATCH_CORRECTIONS)}, got "
                         f"correction={correction!r}")
    lo_default, hi_default = DEFAULT_BOUNDS[correction]
    hi = float(hi_default or 0.0) if upper is None else upper
    lo = float(lo_default or 0.0) if lower is None else lower
    m = mask.bool()
    lr = torch.where(m, log_ratio.detach(), torch.zeros_like(log_ratio)).clamp(-_SAFE, _SAFE)
    if correction == "none":
        w = torch.ones_like(lr)
    elif correction == "tis":
        w = torch.exp(lr).clamp(max=hi)
    elif correction == "mis":
        rho = torch.exp(per_sequence_sum(lr, m).clamp(-_SAFE, _SAFE))
        w = torch.where(rho <= hi, rho, torch.zeros_like(rho))[:, None].expand_as(lr)
    elif correction == "icepop":
        rho = torch.exp(lr)
        w = torch.where((rho >= lo) & (rho <= hi), rho, torch.zeros_like(rho))
    else:  # m2po
        w = _second_moment_mask(lr, m, hi)
    return torch.where(m, w, torch.zeros_like(w))


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
    """The mismatch's size and what the correction did, over the valid tokens:
    ``mismatch_kl_k3`` (k3 of KL(pi_rollout || pi_old), nats per token), ``mismatch_ratio_max``,
    ``mismatch_weight_mean`` and ``mismatch_zeroed`` (the fraction of tokens weighted 0)."""
    m = mask.bool()
    lr = log_ratio.detach()[m].double().clamp(-_SAFE, _SAFE)
    w = weights[m].double()
    rho = torch.exp(lr)
    return {"mismatch_kl_k3": float((rho - 1 - lr).mean()),
            "mismatch_ratio_max": float(rho.max()),
            "mismatch_weight_mean": float(w.mean()),
            "mismatch_zeroed": float((w == 0).double().mean())}
