"""Value losses (with PPO value clipping), entropy terms and explained variance."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import distributions as D

from klppo.core._checks import check_positive, check_same_shape
from klppo.core.names import ValueLossKind

__all__ = ["ValueLossKind", "value_loss", "value_loss_closed_form", "entropy",
           "explained_variance"]

_ELEMENTWISE: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "l2": lambda v, r: 0.5 * (v - r).square(),
    "l1": lambda v, r: (v - r).abs(),
    "smooth_l1": lambda v, r: F.smooth_l1_loss(v, r, reduction="none"),
}


def value_loss(
    values: torch.Tensor,
    returns: torch.Tensor,
    old_values: torch.Tensor | None = None,
    clip: float | None = None,
    kind: ValueLossKind = "l2",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample critic loss and the per-sample value-clip indicator.

    ``l(V, R)`` is ``0.5 (V - R)^2`` (l2), ``|V - R|`` (l1) or the Huber loss (smooth_l1). With
    ``clip = c`` and ``old_values``, PPO's pessimistic clipped loss
    ``max(l(V), l(V_old + clamp(V - V_old, -c, c)))`` is used.

    Returns:
        ``(loss, clipped)``: the per-sample loss (to minimise) and a bool tensor marking samples
        where the clipped branch was the larger one (its mean is the value-clip fraction).
    """
    check_same_shape(values=values, returns=returns)
    try:
        fn = _ELEMENTWISE[kind]
    except KeyError:
        raise ValueError(f"kind must be one of {sorted(_ELEMENTWISE)}, got kind={kind!r}") from None
    unclipped = fn(values, returns)
    if clip is None:
        return unclipped, torch.zeros_like(unclipped, dtype=torch.bool)
    c = check_positive("value_clip", clip)
    if old_values is None:
        raise ValueError("value clipping needs old_values, got old_values=None")
    check_same_shape(values=values, old_values=old_values)
    v_clipped = old_values + torch.clamp(values - old_values, -c, c)
    clipped_loss = fn(v_clipped, returns)
    return torch.max(unclipped, clipped_loss), (clipped_loss > unclipped).detach()


#: kind -> (per-sample loss l(d), dl/dd) of the difference d = V - R, on numpy arrays; the same
#: functions as :data:`_ELEMENTWISE` (tests compare them with autograd on it).
_CLOSED_FORMS: dict[str, tuple[Callable, Callable]] = {
    "l2": (lambda d: 0.5 * d * d, lambda d: d),
    "l1": (np.abs, np.sign),
    "smooth_l1": (lambda d: np.where(np.abs(d) < 1, 0.5 * d * d, np.abs(d) - 0.5),
                  lambda d: np.clip(d, -1, 1)),
}


def value_loss_closed_form(values: np.ndarray, returns: np.ndarray,
                           old_values: np.ndarray | None, clip: float | None,
                           kind: ValueLossKind
                           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`value_loss` and its derivative d loss / d V, per sample, on float32 numpy arrays
    (for the numpy fast path): ``(loss, d loss / d V, clipped)``, ``clipped`` as in
    :func:`value_loss`. At a tie of the clipped and unclipped branches the derivative is their
    mean, as autograd's ``max`` gives it."""
    elem, grad = _CLOSED_FORMS[kind]
    diff = values - returns
    l_un, g_un = elem(diff), grad(diff)
    if clip is None:
        return l_un, g_un, np.zeros(l_un.shape, bool)
    c = np.float32(clip)
    dv = values - old_values
    v_clip = old_values + np.minimum(np.maximum(dv, -c), c)
    l_cl = elem(v_clip - returns)
    g_cl = grad(v_clip - returns) * ((dv >= -c) & (dv <= c))
    g = np.where(l_un > l_cl, g_un, np.where(l_cl > l_un, g_cl, 0.5 * (g_un + g_cl)))
    return np.maximum(l_un, l_cl), g, l_cl > l_un


def entropy(
    dist: D.Distribution, num_samples: int = 16, seed: int | None = None
) -> torch.Tensor:
    """Entropy per state: closed form where torch has one, else Monte Carlo.

    The Monte Carlo estimate is ``-mean_i log p(x_i)`` over ``num_samples`` draws (reparametrised
    where the distribution allows it, so the bonus still has a gradient). Returns
    ``dist.batch_shape``, in nats.
    """
    try:
        return dist.entropy()
    except NotImplementedError:
        n = int(num_samples)
        if n < 1:
            raise ValueError(f"num_samples must be >= 1, got num_samples={num_samples!r}") from None

        def draw() -> torch.Tensor:
            return dist.rsample((n,)) if dist.has_rsample else dist.sample((n,))

        if seed is None:
            x = draw()
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                x = draw()
        return -dist.log_prob(x).mean(0)


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> torch.Tensor:
    """``1 - Var(R - V) / Var(R)``: 1 is a perfect critic, 0 predicts the mean, < 0 is worse.

    Returns nan when the returns have zero variance.
    """
    check_same_shape(values=values, returns=returns)
    var_r = returns.detach().var(unbiased=False)
    resid = (returns - values).detach().var(unbiased=False)
    return torch.where(var_r > 0, 1 - resid / var_r, torch.full_like(var_r, float("nan")))
