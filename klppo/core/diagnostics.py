"""Detached diagnostics of a PPO update: partition fractions, ratio and beta_t statistics, KLs.

Everything returned here is a 0-d detached tensor, so a training loop can accumulate them on the
device and convert to Python numbers once per iteration (no ``.item()`` in the hot loop).
"""

from __future__ import annotations

import torch

from klppo.core.band import DEFAULT_EPS
from klppo.core.kl import sampled_kl
from klppo.core.surrogates import Band, partition

__all__ = ["policy_diagnostics", "beta_quantiles", "QUANTILES"]

#: Quantiles of |beta_t| that the loss reports (``beta_t_q50`` ...).
QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.99)


@torch.no_grad()
def policy_diagnostics(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantage: torch.Tensor,
    eps: Band = DEFAULT_EPS,
    eps_low: Band | None = None,
    eps_high: Band | None = None,
    beta_t: torch.Tensor | None = None,
    ratio: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Per-minibatch diagnostics of the policy term (all detached, 0-d tensors).

    Keys: ``kl_k1`` and ``kl_k3`` (sampled KL(pi_old || pi_new), nats per sample, side by side),
    ``ratio_mean``, ``ratio_min``, ``ratio_max``, ``clip_fraction`` (share with
    ``|w - 1| > eps``), ``frac_in``, ``frac_pass``, ``frac_kill`` (the KLip-PPO partition), and
    when ``beta_t`` is given ``beta_t_abs_mean``, ``beta_t_kill_mean`` (mean beta_t on kill
    samples, 0 when there are none) and the |beta_t| quantiles of :data:`QUANTILES`. ``ratio``
    is the ratio the objective used (default ``exp(logp_new - logp_old)``), so the statistics
    describe the numbers the gradient saw.
    """
    logp_new = logp_new.detach()
    logp_old = logp_old.detach()
    w = (logp_new - logp_old).exp() if ratio is None else ratio.detach()
    in_, pass_, kill = partition(w, advantage, eps, eps_low, eps_high)
    lo = eps if eps_low is None else eps_low
    hi = eps if eps_high is None else eps_high
    out = {
        "kl_k1": sampled_kl(logp_old, logp_new, "k1").mean(),
        "kl_k3": sampled_kl(logp_old, logp_new, "k3").mean(),
        "ratio_mean": w.mean(),
        "ratio_min": w.min(),
        "ratio_max": w.max(),
        "clip_fraction": ((w > 1 + hi) | (w < 1 - lo)).float().mean(),
        "frac_in": in_.float().mean(),
        "frac_pass": pass_.float().mean(),
        "frac_kill": kill.float().mean(),
    }
    if beta_t is not None:
        b = beta_t.detach()
        n_kill = kill.sum()
        out["beta_t_abs_mean"] = b.abs().mean()
        out["beta_t_kill_mean"] = torch.where(kill, b, 0).sum() / n_kill.clamp_min(1)
        out.update(beta_quantiles(b))
    return out


@torch.no_grad()
def beta_quantiles(beta_t: torch.Tensor) -> dict[str, torch.Tensor]:
    """Quantiles of ``|beta_t|`` as ``beta_t_q50``, ``beta_t_q90``, ``beta_t_q99``."""
    flat = beta_t.detach().abs().reshape(-1).float()
    q = torch.quantile(flat, torch.tensor(QUANTILES, dtype=flat.dtype, device=flat.device))
    return {f"beta_t_q{round(p * 100)}": q[i] for i, p in enumerate(QUANTILES)}
