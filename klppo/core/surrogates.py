"""The PPO surrogate family, all as per-sample objectives to MAXIMISE (a loss is the negative).

``w = exp(logp_new - logp_old)`` is the importance ratio and ``A`` the advantage. Three forms of
PPO-Clip are provided and tested against each other:

* the min form ``min(w A, clip(w, 1 - eps, 1 + eps) A)`` (:func:`clip_objective`);
* the Phi form ``w A - Phi(w, A)`` (Theorem 2, :func:`phi_penalty`), equal in value;
* the beta_t form ``w A + beta_t logp_new`` with ``beta_t = -w A`` on the kill set and 0 elsewhere,
  detached (Theorem 1, :func:`per_sample_kl_objective`), equal in gradient.

The per-sample template generalises the third form: any detached coefficient ``beta_t``, chosen
by a *shape*. ``d`` is the signed distance to the harmful band edge (``d > 0`` exactly on kill).

The shapes and their ``beta_t``:

* ``clip``: ``-w A * 1[d > 0]`` (exactly PPO-Clip's gradient);
* ``asymmetric``: as clip with ``eps_low`` / ``eps_high`` (DAPO clip-higher: 0.2 / 0.28), and
  optionally a linear ramp with ``softness_low`` / ``softness_high`` per side;
* ``linear_ramp``: ``-w A * clamp(d / s, 0, 1)``;
* ``sigmoid``: ``-w A * sigmoid(clamp(d / s - s, -60, 60))``;
* ``soft_min``: from the soft-min (temperature s, prior weight e^-s on the clipped branch) of
  the abs(A)-normalised branches ``w sgn(A)`` and ``clip(w) sgn(A)``;
* ``spo``: ``-abs(A) w (w - 1) / eps`` on every sample (Xie et al. 2025);
* ``callable``: ``f(ratio, advantage) -> beta_t`` supplied by the user (detached here).

Every soft shape gives the hard clip gradient as s -> 0 and the unclipped surrogate's as
s -> inf. The spec's plain ``sigmoid(d / s)`` and plain soft-min tend to *half* the unclipped
gradient as s -> inf (sigmoid(0) = 1/2), so klppo shifts the logit by ``-s`` (a prior that
vanishes as s -> 0; at the usual s ~ 0.1 the two differ by less than 3%).

``eps`` and ``softness`` may be floats or tensors of the ratio's shape (position-aware clipping
for sequences). Any per-sample surrogate ``f(w, A)`` maps into the template through
``beta_t = w df/dw - w A`` (:func:`template_beta`).
"""

from __future__ import annotations

import typing
from collections.abc import Callable

import torch

from klppo.core._checks import check_positive, check_same_shape
from klppo.core.band import DEFAULT_EPS, DEFAULT_EPS_HIGH_ASYMMETRIC, kill_mask, kill_sides
from klppo.core.band import band_edges as _band
from klppo.core.names import Shape

ShapeLike = Shape | Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Band = float | torch.Tensor

__all__ = [
    "Shape",
    "SHAPES",
    "SOFT_SHAPES",
    "partition",
    "harm_distance",
    "unclipped_objective",
    "clip_objective",
    "phi_penalty",
    "kl_penalty_objective",
    "per_sample_beta",
    "per_sample_kl_objective",
    "template_beta",
]


def partition(
    ratio: torch.Tensor,
    advantage: torch.Tensor,
    eps: Band = DEFAULT_EPS,
    eps_low: Band | None = None,
    eps_high: Band | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split samples into the KLip-PPO partition, from the detached ratio.

    * kill: ``(w > 1 + eps_high and A > 0) or (w < 1 - eps_low and A < 0)``: the clip zeroes
      the gradient;
    * pass: ``(w > 1 + eps_high and A < 0) or (w < 1 - eps_low and A > 0)``: out of the band but
      the unclipped term is the min, so the gradient stays;
    * in: everything else (inside the band, or ``A == 0``).

    Returns three bool tensors ``(in_mask, pass_mask, kill_mask)`` of the input shape; they are
    disjoint and cover every sample.
    """
    check_same_shape(ratio=ratio, advantage=advantage)
    lo, hi = _band(eps, eps_low, eps_high)
    w = ratio.detach()
    kill = kill_mask(w, advantage, lo, hi)
    pass_ = ((w > 1 + hi) & (advantage < 0)) | ((w < 1 - lo) & (advantage > 0))
    in_ = ~(kill | pass_)
    return in_, pass_, kill


def harm_distance(
    ratio: torch.Tensor,
    advantage: torch.Tensor,
    eps: Band = DEFAULT_EPS,
    eps_low: Band | None = None,
    eps_high: Band | None = None,
) -> torch.Tensor:
    """Signed distance to the harmful band edge, from the detached ratio.

    ``d = w - (1 + eps_high)`` if ``A > 0``; ``d = (1 - eps_low) - w`` if ``A < 0``; ``-inf`` if
    ``A == 0``. ``d > 0`` exactly on the kill set.
    """
    check_same_shape(ratio=ratio, advantage=advantage)
    return _harm_distance(ratio.detach(), advantage, eps, eps_low, eps_high)


def _harm_distance(w, a, eps, eps_low, eps_high) -> torch.Tensor:
    lo, hi = _band(eps, eps_low, eps_high)
    d = torch.where(a > 0, w - (1 + hi), (1 - lo) - w)
    return torch.where(a == 0, torch.full_like(d, -torch.inf), d)


def unclipped_objective(ratio: torch.Tensor, advantage: torch.Tensor) -> torch.Tensor:
    """Importance-sampled surrogate ``w * A`` per sample (no trust region)."""
    check_same_shape(ratio=ratio, advantage=advantage)
    return ratio * advantage


def clip_objective(
    ratio: torch.Tensor,
    advantage: torch.Tensor,
    eps: Band = DEFAULT_EPS,
    eps_low: Band | None = None,
    eps_high: Band | None = None,
    dual_clip: float | None = None,
) -> torch.Tensor:
    """PPO-Clip per sample, min form: ``min(w A, clip(w, 1 - eps_low, 1 + eps_high) A)``.

    Args:
        ratio: ``w``, any shape, with gradient.
        advantage: ``A``, same shape (treated as a constant).
        eps: symmetric clip radius (typical 0.1-0.3; 0.2 by default).
        eps_low, eps_high: asymmetric band, overriding ``eps`` on one side (DAPO: 0.2 / 0.28).
        dual_clip: ``c > 1``; for ``A < 0`` the objective is ``max(min(...), c A)`` (Ye et al.
            2020; c = 3 is usual). None disables it.
    """
    check_same_shape(ratio=ratio, advantage=advantage)
    lo, hi = _band(eps, eps_low, eps_high)
    clipped = _clamp_band(ratio, lo, hi)
    obj = torch.min(ratio * advantage, clipped * advantage)
    if dual_clip is not None:
        c = float(dual_clip)
        if not c > 1:
            raise ValueError(f"dual_clip must be > 1, got dual_clip={dual_clip!r}")
        obj = torch.where(advantage < 0, torch.max(obj, c * advantage), obj)
    return obj


def _clamp_band(ratio: torch.Tensor, lo: Band, hi: Band) -> torch.Tensor:
    """``clamp(ratio, 1 - lo, 1 + hi)`` for float or per-sample tensor bands."""
    if isinstance(lo, torch.Tensor) or isinstance(hi, torch.Tensor):
        lo_t = torch.as_tensor(lo, dtype=ratio.dtype, device=ratio.device)
        hi_t = torch.as_tensor(hi, dtype=ratio.dtype, device=ratio.device)
        return torch.clamp(ratio, 1 - lo_t, 1 + hi_t)
    return torch.clamp(ratio, 1 - lo, 1 + hi)


def phi_penalty(
    ratio: torch.Tensor,
    advantage: torch.Tensor,
    eps: Band = DEFAULT_EPS,
    eps_low: Band | None = None,
    eps_high: Band | None = None,
) -> torch.Tensor:
    """Theorem 2's weight-space penalty ``Phi(w, A) >= 0`` with ``min(wA, clip(w)A) = wA - Phi``.

    ``Phi = (w - (1 + eps_high)) A`` on ``{w > 1 + eps_high, A > 0}``,
    ``(w - (1 - eps_low)) A`` on ``{w < 1 - eps_low, A < 0}``, 0 elsewhere. Differentiable in w.
    """
    check_same_shape(ratio=ratio, advantage=advantage)
    lo, hi = _band(eps, eps_low, eps_high)
    up, down = kill_sides(ratio, advantage, lo, hi)
    zero = torch.zeros((), dtype=ratio.dtype, device=ratio.device)
    phi = torch.where(up, (ratio - (1 + hi)) * advantage, zero)
    return torch.where(down, (ratio - (1 - lo)) * advantage, phi)


def kl_penalty_objective(
    ratio: torch.Tensor, advantage: torch.Tensor, kl: torch.Tensor, beta: float | torch.Tensor
) -> torch.Tensor:
    """Scalar KL penalty (PPO-KL) per sample: ``w A - beta * KL_t``.

    ``kl`` is any per-sample estimate of KL(pi_old || pi_new) (analytic per state, or a sampled
    estimator from :mod:`klppo.core.kl`), in nats per sample; ``beta`` comes from a controller and
    is treated as a constant; for ``[A, B]`` inputs (the rows of a stack) it may be ``[A, 1]``,
    one per row.
    """
    check_same_shape(ratio=ratio, advantage=advantage, kl=kl)
    if isinstance(beta, torch.Tensor):
        per_row = kl.ndim == 2 and tuple(beta.shape) == (kl.shape[0], 1)
        if beta.numel() != 1 and not per_row:
            raise ValueError(f"beta must be a scalar (or [A, 1] for [A, B] rows), got shape "
                             f"{tuple(beta.shape)}")
        beta = beta.detach()
    return ratio * advantage - beta * kl


# --------------------------------------------------------------------------------- beta_t shapes
def _gate_linear(d: torch.Tensor, s: Band) -> torch.Tensor:
    return torch.clamp(d / s, 0.0, 1.0)


def _gate_sigmoid(d: torch.Tensor, s: Band) -> torch.Tensor:
    return torch.sigmoid(torch.clamp(d / s - s, -60.0, 60.0))


def _softness(name: str, s: Band | None) -> Band:
    if s is None:
        raise ValueError(f"shape {name!r} needs softness > 0, got softness=None")
    if isinstance(s, torch.Tensor):
        if not bool((s > 0).all()):
            raise ValueError(f"softness must be > 0 everywhere, got min {s.min().item()}")
        return s
    return check_positive("softness", s)


def per_sample_beta(
    ratio: torch.Tensor,
    advantage: torch.Tensor,
    eps: Band = DEFAULT_EPS,
    shape: ShapeLike = "clip",
    softness: Band | None = None,
    eps_low: Band | None = None,
    eps_high: Band | None = None,
    softness_low: Band | None = None,
    softness_high: Band | None = None,
    dual_clip: float | None = None,
) -> torch.Tensor:
    """The detached per-sample coefficient ``beta_t`` of the KLip-PPO template.

    Computed from the detached ratio at the current parameters, so recompute it at every
    minibatch step. Returns a tensor of the ratio's shape with ``requires_grad=False``; see the
    module docstring for each shape's formula. ``dual_clip = c`` adds ``-w A`` on
    ``{A < 0, w > c}`` to any shape.
    """
    check_same_shape(ratio=ratio, advantage=advantage)
    w = ratio.detach()
    a = advantage.detach()
    return _beta(w, a, w * a, eps, shape, softness, eps_low, eps_high, softness_low,
                 softness_high, dual_clip)


def _beta(
    w: torch.Tensor,
    a: torch.Tensor,
    wa: torch.Tensor,
    eps: Band,
    shape: ShapeLike,
    softness: Band | None,
    eps_low: Band | None,
    eps_high: Band | None,
    softness_low: Band | None,
    softness_high: Band | None,
    dual_clip: float | None,
) -> torch.Tensor:
    """beta_t from detached, already validated ``w``, ``a`` and ``wa = w * a``."""
    zero = torch.zeros((), dtype=w.dtype, device=w.device)
    if callable(shape):
        beta = shape(w, a)
        if not isinstance(beta, torch.Tensor) or beta.shape != w.shape:
            got = tuple(beta.shape) if isinstance(beta, torch.Tensor) else type(beta).__name__
            raise ValueError(f"a callable shape must return a tensor of shape {tuple(w.shape)}, "
                             f"got {got}")
        beta = beta.detach()
    elif shape == "clip" or (shape == "asymmetric" and softness_low is None
                             and softness_high is None and softness is None):
        if shape == "asymmetric" and eps_high is None:
            eps_high = DEFAULT_EPS_HIGH_ASYMMETRIC
        lo, hi = _band(eps, eps_low, eps_high)
        kill = kill_mask(w, a, lo, hi)
        beta = torch.where(kill, -wa, zero)
    elif shape == "asymmetric":
        if eps_high is None:
            eps_high = DEFAULT_EPS_HIGH_ASYMMETRIC
        s_lo = _softness("asymmetric", softness_low if softness_low is not None else softness)
        s_hi = _softness("asymmetric", softness_high if softness_high is not None else softness)
        d = _harm_distance(w, a, eps, eps_low, eps_high)
        gate = torch.where(a > 0, _gate_linear(d, s_hi), _gate_linear(d, s_lo))
        beta = torch.where(a == 0, zero, -wa * gate)
    elif shape in ("linear_ramp", "sigmoid"):
        s = _softness(shape, softness)
        d = _harm_distance(w, a, eps, eps_low, eps_high)
        gate = _gate_linear(d, s) if shape == "linear_ramp" else _gate_sigmoid(d, s)
        beta = torch.where(a == 0, zero, -wa * gate)
    elif shape == "soft_min":
        # f = |A| softmin_s(w sgnA, clip(w) sgnA) with prior weight e^-s on the clipped branch.
        # beta_t = w df/dw - wA = -wA * q * (1 - clip'(w)), q = weight of the clipped branch.
        s = _softness(shape, softness)
        lo, hi = _band(eps, eps_low, eps_high)
        clipped = _clamp_band(w, lo, hi)
        q = torch.sigmoid(torch.clamp((w - clipped) * torch.sign(a) / s - s, -60.0, 60.0))
        beta = torch.where((w != clipped) & (a != 0), -wa * q, zero)
    elif shape == "spo":
        e = eps if not isinstance(eps, torch.Tensor) else eps.detach()
        beta = -a.abs() * w * (w - 1) / e
    else:
        raise ValueError(f"shape must be one of {list(SHAPES)} or a callable, got shape={shape!r}")
    if dual_clip is not None:
        c = float(dual_clip)
        if not c > 1:
            raise ValueError(f"dual_clip must be > 1, got dual_clip={dual_clip!r}")
        beta = torch.where((a < 0) & (w > c), -wa, beta)
    return beta


#: The named shapes accepted by :func:`per_sample_beta`.
SHAPES: tuple[str, ...] = typing.get_args(Shape)

#: The shapes that need a softness ``s > 0``.
SOFT_SHAPES: tuple[str, ...] = ("linear_ramp", "sigmoid", "soft_min")


def per_sample_kl_objective(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantage: torch.Tensor,
    eps: Band = DEFAULT_EPS,
    shape: ShapeLike = "clip",
    softness: Band | None = None,
    *,
    eps_low: Band | None = None,
    eps_high: Band | None = None,
    softness_low: Band | None = None,
    softness_high: Band | None = None,
    dual_clip: float | None = None,
    return_beta: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """KLip-PPO per-sample KL objective ``w A + beta_t * logp_new`` with ``beta_t`` detached.

    ``beta_t * logp_new`` is, up to a constant, ``-beta_t * k1`` with the sampled
    ``k1 = logp_old - logp_new`` of KL(pi_old || pi_new): a KL penalty whose coefficient varies
    per sample. With ``shape="clip"`` its gradient equals PPO-Clip's (Theorem 1), bit for bit in
    float32 when the mean is over a power-of-two number of samples and no product underflows to
    a subnormal (where both round on the subnormal grid they may differ by a few 2^-149), except
    where ``w A`` and ``clip(w) A`` round to the same float32 outside the band: autograd's
    ``min`` then gives PPO-Clip half the unclipped gradient (a float32 tie, not the theorem).
    Two conditions are load-bearing: ``beta_t`` is detached, and the penalty is the *sampled*
    log-probability (the analytic KL gives a different gradient).

    Args:
        logp_new: ``log pi_new(a|s)`` with gradient, any shape.
        logp_old: ``log pi_old(a|s)`` of the behaviour policy, same shape (constant).
        advantage: ``A``, same shape (constant).
        eps, shape, softness, eps_low, eps_high, softness_low, softness_high, dual_clip:
            see :func:`per_sample_beta`.
        return_beta: also return ``beta_t`` (for diagnostics).

    Returns:
        The per-sample objective (to maximise), and ``beta_t`` if ``return_beta``.
    """
    check_same_shape(logp_new=logp_new, logp_old=logp_old, advantage=advantage)
    a = advantage.detach()
    ratio = torch.exp(logp_new - logp_old.detach())
    wa = ratio * a
    beta = _beta(ratio.detach(), a, wa.detach(), eps, shape, softness, eps_low, eps_high,
                 softness_low, softness_high, dual_clip)
    obj = wa + beta * logp_new
    return (obj, beta) if return_beta else obj


def template_beta(
    surrogate: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    ratio: torch.Tensor,
    advantage: torch.Tensor,
) -> torch.Tensor:
    """The template coefficient of any per-sample surrogate: ``beta_t = w df/dw - w A``.

    ``surrogate(ratio, advantage)`` must return per-sample values; its derivative in ``w`` is
    taken with autograd at the detached ratio. Returns a detached tensor of the ratio's shape.
    """
    check_same_shape(ratio=ratio, advantage=advantage)
    w = ratio.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        f = surrogate(w, advantage.detach())
        (dfdw,) = torch.autograd.grad(f.sum(), w)
    return (w * dfdw - w * advantage).detach()
