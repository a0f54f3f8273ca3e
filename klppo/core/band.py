"""The trust band of the ratio and its kill set: ONE definition for torch and numpy.

The band is ``[1 - lo, 1 + hi]`` around ``w = 1`` (``w = pi_new / pi_old`` per sample). ``lo`` and
``hi`` default to the symmetric radius ``eps`` (:data:`DEFAULT_EPS`); the asymmetric shape's upper
edge defaults to DAPO's clip-higher radius (:data:`DEFAULT_EPS_HIGH_ASYMMETRIC`). The *kill set*
is where PPO-Clip zeroes the gradient:

    up   = {w > 1 + hi and A > 0}
    down = {w < 1 - lo and A < 0}
    kill = up | down

:func:`kill_sides` and :func:`kill_mask` compute it with the array's own comparison operators, so
they run on torch tensors and numpy arrays alike (booleans: exact, whatever the array module).
:func:`klppo.core.surrogates.partition`, :func:`~klppo.core.surrogates.phi_penalty`, the clip
shape of :func:`~klppo.core.surrogates.per_sample_beta` and the numpy closed form in
:mod:`klppo.core.objectives` all use them.
"""

from __future__ import annotations

from typing import Any

import torch

from klppo.core._checks import check_positive

__all__ = ["DEFAULT_EPS", "DEFAULT_EPS_HIGH_ASYMMETRIC", "band_edges", "kill_sides", "kill_mask"]

#: PPO's symmetric clip radius (Schulman et al. 2017); typical 0.1-0.3.
DEFAULT_EPS = 0.2

#: The asymmetric shape's upper radius when none is given: DAPO's clip-higher (Yu et al. 2025).
DEFAULT_EPS_HIGH_ASYMMETRIC = 0.28


def band_edges(eps: Any, eps_low: Any | None, eps_high: Any | None) -> tuple[Any, Any]:
    """``(lo, hi)``: each side's radius (``eps`` unless overridden), checked ``> 0``.

    Radii are floats or per-sample tensors of the ratio's shape; ValueError names the bad one.
    """
    lo = eps if eps_low is None else eps_low
    hi = eps if eps_high is None else eps_high
    for name, v in (("eps_low", lo), ("eps_high", hi)):
        if isinstance(v, torch.Tensor):
            if not bool((v > 0).all()):
                raise ValueError(f"{name} must be > 0 everywhere, got min {v.min().item()}")
        else:
            check_positive(name if eps_low is not None or eps_high is not None else "eps", v)
    return lo, hi


def kill_sides(w: Any, a: Any, lo: Any, hi: Any) -> tuple[Any, Any]:
    """The two halves of the kill set, bool arrays of ``w``'s shape:
    ``up = (w > 1 + hi) & (A > 0)`` and ``down = (w < 1 - lo) & (A < 0)``.

    ``w`` (ratio) and ``a`` (advantage) are torch tensors or numpy arrays of one shape; ``lo`` and
    ``hi`` floats or arrays broadcastable to it (already validated, see :func:`band_edges`).
    """
    return (w > 1 + hi) & (a > 0), (w < 1 - lo) & (a < 0)


def kill_mask(w: Any, a: Any, lo: Any, hi: Any) -> Any:
    """The kill set ``up | down`` of :func:`kill_sides` (where the clip zeroes the gradient)."""
    up, down = kill_sides(w, a, lo, hi)
    return up | down
