"""KL estimators and the masked reductions that give a KL its unit.

Notation: samples ``x ~ q`` (the *sampling* distribution) and ``p`` the other distribution;
``log r = log p(x) - log q(x)``. Every sampled estimator below is a per-sample quantity whose mean
estimates ``KL(q || p) = E_q[log q - log p]``:

| name | per-sample value | bias | variance / sign |
|---|---|---|---|
| ``k1`` | ``-log r`` | unbiased | high; negative on ~half |
| ``k2`` | ``0.5 (log r)^2`` | biased (agrees to 2nd order) | low; always >= 0 |
| ``k3`` | ``(r - 1) - log r`` | unbiased | low; >= 0 (r - 1: control variate) |
| ``abs`` | ``abs(log r)`` | biased (upwards) | low; always >= 0 |

Two more, for users reproducing peers (in the RLHF direction, ``d = log q - log p = -log r``,
e.g. ``d = logp - logp_ref``); both are **not** estimates of ``KL(q || p)``:

* ``k3_flipped``, ``e^d - 1 - d``: trlx's k3 with the ratio flipped. Its mean is
  ``chi^2(q || p) - KL(q || p)``; >= 0.
* ``tutorial``, ``e^d d``: the adaptive-KL RLHF tutorial's estimator. Its mean is
  ``E_q[(q/p) log(q/p)]``, heavily biased upwards: for ``q = N(0, 1)``, ``p = N(0.5, 1)``
  (KL 0.125) it is ``0.375 e^0.25 = 0.48``; for ``p = N(2, 1)`` (KL 2) ``6 e^4 = 328``. It
  can be negative on a sample.

Two uses in PPO, with the sampling side made explicit by the argument order of
:func:`sampled_kl`:

* trust region ``KL(pi_old || pi_new)`` on data from ``pi_old``:
  ``sampled_kl(logp_old, logp_new)``; k1 = ``logp_old - logp_new``, k3 = ``(w - 1) - log w``;
* RLHF reference ``KL(pi || pi_ref)`` on data from ``pi``: ``sampled_kl(logp, logp_ref)``;
  k3 = ``exp(logp_ref - logp) - 1 - (logp_ref - logp)``. (Flipping the sign, i.e.
  ``exp(d) - 1 - d`` with ``d = logp - logp_ref``, estimates chi^2-ish nonsense, not the KL:
  a known peer bug.)

Units: a per-sample estimate has no unit of aggregation yet. :func:`reduce_kl` and the named
reductions turn it into a per-sample mean, per-token mean, per-sequence sum or per-sequence mean;
a target KL is only meaningful together with that unit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import torch
from torch import distributions as D
from torch.utils.checkpoint import checkpoint

from klppo.core._checks import check_same_shape, check_shapes_only, check_tensor

Estimator = Literal["k1", "k2", "k3", "abs", "k3_flipped", "tutorial", "k1+", "k3+"]
KLUnit = Literal["per_sample_mean", "per_token_mean", "per_sequence_sum", "per_sequence_mean"]

__all__ = [
    "Estimator",
    "KLUnit",
    "ESTIMATORS",
    "ESTIMATOR_GRADS",
    "NOT_KL",
    "sampled_kl",
    "k1",
    "k2",
    "k3",
    "abs_kl",
    "analytic_kl",
    "monte_carlo_kl",
    "full_kl",
    "per_sample_mean",
    "per_token_mean",
    "per_sequence_sum",
    "per_sequence_mean",
    "reduce_kl",
]


def _xp(x: Any) -> Any:
    """The array module of ``x``: the estimators run on torch tensors and numpy arrays alike
    (the numpy fast path evaluates the same definitions)."""
    return np if isinstance(x, np.ndarray) else torch


def k1(log_r: torch.Tensor) -> torch.Tensor:
    """``-log r``: unbiased for KL(q || p), high variance, negative on about half the samples."""
    return -log_r


def k2(log_r: torch.Tensor) -> torch.Tensor:
    """``0.5 (log r)^2``: biased (matches the KL to second order in log r), low variance, >= 0."""
    return 0.5 * (log_r * log_r)


def k3(log_r: torch.Tensor) -> torch.Tensor:
    """``(r - 1) - log r``: unbiased for KL(q || p), low variance, >= 0 (since e^x >= 1 + x)."""
    return _xp(log_r).expm1(log_r) - log_r


def abs_kl(log_r: torch.Tensor) -> torch.Tensor:
    """``|log r|``: biased upwards, >= 0 (offered by verl and TRL)."""
    return abs(log_r)


def k3_flipped(log_r: torch.Tensor) -> torch.Tensor:
    """trlx's ``e^d - 1 - d`` with ``d = -log r``: mean chi^2 - KL, **not** the KL."""
    return _xp(log_r).expm1(-log_r) + log_r


def tutorial_kl(log_r: torch.Tensor) -> torch.Tensor:
    """The RLHF tutorial's ``e^d d`` with ``d = -log r``: heavily biased, **not** the KL."""
    return -log_r * _xp(log_r).exp(-log_r)


def _straight_through(value: Any, grad_of: Any) -> Any:
    """``value`` forward, the gradient of ``grad_of`` backward (``g - sg(g) + sg(v)``); on numpy
    arrays the value alone (the fast path takes gradients from :data:`ESTIMATOR_GRADS`)."""
    if isinstance(value, np.ndarray):
        return value
    return grad_of - grad_of.detach() + value.detach()


def k1_plus(log_r: torch.Tensor) -> torch.Tensor:
    """verl's ``k1+``: the value of :func:`k1`, the gradient of :func:`k2` (straight through)."""
    return _straight_through(k1(log_r), k2(log_r))


def k3_plus(log_r: torch.Tensor) -> torch.Tensor:
    """verl's ``k3+``: the value of :func:`k3`, the gradient of :func:`k2` (straight through;
    verl also clamps its k3, which this does not)."""
    return _straight_through(k3(log_r), k2(log_r))


#: name -> function of ``log r = log p - log q`` on samples from q. One small table, no if/elif.
#: name -> per-sample estimate of log w (torch tensors and numpy arrays alike)
ESTIMATORS: dict[str, Callable[[Any], Any]] = {
    "k1": k1,
    "k2": k2,
    "k3": k3,
    "abs": abs_kl,
    "k3_flipped": k3_flipped,
    "tutorial": tutorial_kl,
    "k1+": k1_plus,
    "k3+": k3_plus,
}

#: estimators whose mean is not KL(q || p): selectable to reproduce a peer, with a warning
NOT_KL: frozenset[str] = frozenset({"k3_flipped", "tutorial"})

#: name -> d estimator / d log r (log r = logp_new - logp_old for the PPO trust region), on
#: torch tensors or numpy arrays; tests check each against autograd on :data:`ESTIMATORS`.
ESTIMATOR_GRADS: dict[str, Callable[[Any], Any]] = {
    "k1": lambda log_r: -_xp(log_r).ones_like(log_r),
    "k2": lambda log_r: log_r,
    "k3": lambda log_r: _xp(log_r).expm1(log_r),
    "abs": lambda log_r: _xp(log_r).sign(log_r),
    "k3_flipped": lambda log_r: -_xp(log_r).expm1(-log_r),
    "tutorial": lambda log_r: (log_r - 1) * _xp(log_r).exp(-log_r),
    "k1+": lambda log_r: log_r,  # straight through: k2's
    "k3+": lambda log_r: log_r,
}


def sampled_kl(
    logp_sampling: torch.Tensor, logp_other: torch.Tensor, estimator: Estimator = "k3"
) -> torch.Tensor:
    """Per-sample estimates of ``KL(sampling || other)`` from samples drawn from ``sampling``.

    Args:
        logp_sampling: ``log q(x)``, shape ``[...]``: log-probability of each sample under the
            distribution that generated it (``pi_old`` for the PPO trust region, the policy ``pi``
            in RLHF).
        logp_other: ``log p(x)``, same shape: log-probability of the same samples under the other
            distribution (``pi_new``, or the frozen reference ``pi_ref``).
        estimator: ``"k1"``, ``"k2"``, ``"k3"`` (default) or ``"abs"``; see the module table
            for bias and variance.

    Returns:
        Tensor of the same shape; its (masked) mean estimates ``KL(sampling || other)`` in nats
        per sample. Gradients flow to both inputs.
    """
    check_same_shape(logp_sampling=logp_sampling, logp_other=logp_other)
    try:
        fn = ESTIMATORS[estimator]
    except KeyError:
        raise ValueError(
            f"estimator must be one of {sorted(ESTIMATORS)}, got estimator={estimator!r}"
        ) from None
    return fn(logp_other - logp_sampling)


def monte_carlo_kl(
    p: D.Distribution,
    q: D.Distribution,
    num_samples: int = 128,
    seed: int | None = None,
    reparameterize: bool | None = None,
) -> torch.Tensor:
    """Monte Carlo ``KL(p || q) ~ mean_i [log p(x_i) - log q(x_i)]`` with ``x_i ~ p`` (k1 form).

    Unbiased; standard error ``std(log p - log q) / sqrt(num_samples)``. Returns a tensor of
    ``p.batch_shape``. Draws come from torch's global generator unless ``seed`` is given, in which
    case they come from a forked generator seeded with it (the global state is left untouched).
    Gradients flow through ``q`` (and through ``p`` when the draws are reparameterised).

    ``reparameterize``: None draws with ``rsample`` where ``p`` has it, else ``sample``; False
    always ``sample`` (what TorchRL's KLPENPPOLoss does); True always ``rsample``. A
    distribution that scores its own draw (a ``sample_and_log_prob`` /
    ``rsample_and_log_prob`` method, as TorchRL's TanhNormal has) is asked for ``log p(x_i)``
    from the same latent draw rather than through ``log_prob`` of the rounded sample (which
    inverts tanh, inexactly once it saturates).
    """
    n = int(num_samples)
    if n < 1:
        raise ValueError(f"num_samples must be >= 1, got num_samples={num_samples!r}")
    rep = p.has_rsample if reparameterize is None else bool(reparameterize)
    if rep and not p.has_rsample:
        raise ValueError(f"reparameterize=True but {type(p).__name__} has no rsample")

    def draw() -> tuple[torch.Tensor, torch.Tensor]:
        joint = getattr(p, "rsample_and_log_prob" if rep else "sample_and_log_prob", None)
        if callable(joint):
            return joint((n,))
        x = p.rsample((n,)) if rep else p.sample((n,))
        return x, p.log_prob(x)

    if seed is None:
        x, log_p = draw()
    else:
        devices: list[Any] | None = [] if x_device_is_cpu(p) else None
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            x, log_p = draw()
    return (log_p - q.log_prob(x)).mean(0)


def x_device_is_cpu(p: D.Distribution) -> bool:
    """True when the distribution's parameters live on the CPU (fork_rng then forks CPU only)."""
    for value in vars(p).values():
        if isinstance(value, torch.Tensor):
            return value.device.type == "cpu"
    return True


def analytic_kl(
    p: D.Distribution, q: D.Distribution, num_samples_mc: int = 128, seed: int | None = None
) -> torch.Tensor:
    """Exact ``KL(p || q)`` per state where torch knows a closed form, else Monte Carlo.

    Covers Categorical, Normal (elementwise) and ``Independent(Normal, 1)`` (summed over action
    dimensions), and every other pair registered with ``torch.distributions.kl_divergence``.
    For pairs with no closed form it falls back to :func:`monte_carlo_kl` with ``num_samples_mc``
    draws from ``p``. Returns a tensor of ``p.batch_shape`` in nats per state.
    """
    try:
        return D.kl_divergence(p, q)
    except NotImplementedError:
        return monte_carlo_kl(p, q, num_samples_mc, seed=seed)


def _kl_from_logits(logits_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(logits_p.float(), dim=-1)
    logq = torch.log_softmax(logits_q.float(), dim=-1)
    return (logp.exp() * (logp - logq)).sum(-1)


def full_kl(
    logits_p: torch.Tensor,
    logits_q: torch.Tensor,
    mask: torch.Tensor | None = None,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """Exact ``KL(p || q)`` over the whole vocabulary at every position of a sequence model.

    Args:
        logits_p: ``[..., T, V]`` unnormalised logits of ``p`` (the policy, for RLHF).
        logits_q: same shape, logits of ``q`` (the reference).
        mask: optional ``[..., T]`` bool tensor; positions where it is False get exactly 0
            (whatever the logits hold there, NaN included).
        chunk_size: number of positions processed at once. Peak extra memory is about
            ``3 * chunk_size * V`` floats; under autograd each chunk is recomputed in the
            backward pass (activation checkpointing), so memory stays bounded there too.

    Returns:
        ``[..., T]`` float32 tensor of per-position KL in nats (a per-token quantity: reduce it
        with :func:`per_token_mean` or :func:`per_sequence_sum` to give it a unit).
    """
    if mask is None:
        check_same_shape(logits_p=logits_p, logits_q=logits_q)
    else:  # padded positions may hold anything; the result is checked instead
        check_shapes_only(logits_p=logits_p, logits_q=logits_q)
    if logits_p.dim() < 2:
        raise ValueError(f"logits must have shape [..., T, V], got {tuple(logits_p.shape)}")
    if int(chunk_size) < 1:
        raise ValueError(f"chunk_size must be >= 1, got chunk_size={chunk_size!r}")
    lead = logits_p.shape[:-1]
    vocab = logits_p.shape[-1]
    flat_p = logits_p.reshape(-1, vocab)
    flat_q = logits_q.reshape(-1, vocab)
    flat_mask = None
    if mask is not None:
        if mask.shape != lead:
            raise ValueError(
                f"mask must have shape {tuple(lead)} (logits without the vocabulary axis), "
                f"got {tuple(mask.shape)}"
            )
        flat_mask = mask.reshape(-1).bool()
    use_ckpt = torch.is_grad_enabled() and (flat_p.requires_grad or flat_q.requires_grad)
    out = []
    for start in range(0, flat_p.shape[0], int(chunk_size)):
        lp = flat_p[start : start + chunk_size]
        lq = flat_q[start : start + chunk_size]
        if flat_mask is not None:
            m = flat_mask[start : start + chunk_size, None]
            lp = torch.where(m, lp, torch.zeros((), dtype=lp.dtype, device=lp.device))
            lq = torch.where(m, lq, torch.zeros((), dtype=lq.dtype, device=lq.device))
        if use_ckpt:
            kl = checkpoint(_kl_from_logits, lp, lq, use_reentrant=False)
        else:
            kl = _kl_from_logits(lp, lq)
        out.append(kl)
    result = torch.cat(out).reshape(lead)
    if flat_mask is not None and mask is not None:
        result = torch.where(mask.bool(), result, torch.zeros((), device=result.device))
        check_tensor("full_kl (valid positions)", result)
    return result


# ----------------------------------------------------------------------------------- reductions
def _masked(values: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    if mask is None:
        check_tensor("values", values)
        return values, torch.ones_like(values, dtype=torch.bool)
    if mask.shape != values.shape:
        raise ValueError(
            f"mask has shape {tuple(mask.shape)} but values have shape {tuple(values.shape)}"
        )
    m = mask.bool()
    # torch.where, not multiplication: a NaN or inf in a padded slot must not leak into the sum.
    v = torch.where(m, values, torch.zeros((), dtype=values.dtype, device=values.device))
    return check_tensor("values (valid positions)", v), m


def per_sample_mean(values: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Scalar mean over all valid samples. Unit: nats per sample (RL: per state-action pair)."""
    v, m = _masked(values, mask)
    return v.sum() / m.sum().clamp_min(1)


def per_token_mean(values: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Scalar mean over all valid tokens of a ``[B, T]`` batch. Unit: nats per token."""
    return per_sample_mean(values, mask)


def per_sequence_sum(values: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """``[B]`` sum over the valid tokens of each sequence (last axis). Unit: nats per sequence."""
    v, _ = _masked(values, mask)
    return v.sum(-1)


def per_sequence_mean(values: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """``[B]`` mean over the valid tokens of each sequence. Unit: nats per token, per sequence.

    A sequence with no valid token gives 0.
    """
    v, m = _masked(values, mask)
    return v.sum(-1) / m.sum(-1).clamp_min(1)


_REDUCTIONS: dict[str, Callable[..., torch.Tensor]] = {
    "per_sample_mean": per_sample_mean,
    "per_token_mean": per_token_mean,
    "per_sequence_sum": lambda v, m=None: per_sequence_sum(v, m).mean(),
    "per_sequence_mean": lambda v, m=None: per_sequence_mean(v, m).mean(),
}


def reduce_kl(values: torch.Tensor, unit: KLUnit, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Reduce per-sample (or per-token) KL estimates to one scalar in the named unit.

    ``per_sequence_sum`` and ``per_sequence_mean`` are averaged over the sequences of the batch,
    so the scalar reads "nats per sequence" and "nats per token (sequence-weighted)".
    """
    try:
        fn = _REDUCTIONS[unit]
    except KeyError:
        raise ValueError(f"unit must be one of {sorted(_REDUCTIONS)}, got unit={unit!r}") from None
    return fn(values, mask)


