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
    rows: bool = False,
) -> dict[str, torch.Tensor]:
    """Per-minibatch diagnostics of the policy term (all detached, 0-d tensors; with ``rows``,
    over the last dimension: inputs ``[A, n]`` give each row's ``[A]``, the numbers of the row
    alone).

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
    dim, ext = (-1, -1) if rows else (None, ())  # ext: amin / amax's "every dimension" is ()
    out = {
        "kl_k1": sampled_kl(logp_old, logp_new, "k1").mean(dim),
        "kl_k3": sampled_kl(logp_old, logp_new, "k3").mean(dim),
        "ratio_mean": w.mean(dim),
        "ratio_min": w.amin(ext),
        "ratio_max": w.amax(ext),
        "clip_fraction": ((w > 1 + hi) | (w < 1 - lo)).float().mean(dim),
        "frac_in": in_.float().mean(dim),
        "frac_pass": pass_.float().mean(dim),
        "frac_kill": kill.float().mean(dim),
    }
    if beta_t is not None:
        b = beta_t.detach()
        n_kill = kill.sum(dim)
        out["beta_t_abs_mean"] = b.abs().mean(dim)
        out["beta_t_kill_mean"] = torch.where(kill, b, 0).sum(dim) / n_kill.clamp_min(1)
        out.update(beta_quantiles(b, rows))
    return out


@torch.no_grad()
def beta_quantiles(beta_t: torch.Tensor, rows: bool = False) -> dict[str, torch.Tensor]:
    """Quantiles of ``|beta_t|`` as ``beta_t_q50``, ``beta_t_q90``, ``beta_t_q99`` (of every
    element; with ``rows``, of each row of ``[A, n]``)."""
    b = beta_t.detach().abs().float()
    flat = b if rows else b.reshape(-1)
    q = torch.quantile(flat, torch.tensor(QUANTILES, dtype=flat.dtype, device=flat.device),
                       dim=-1)
    return {f"beta_t_q{round(p * 100)}": q[i] for i, p in enumerate(QUANTILES)}
