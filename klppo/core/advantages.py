"""Generalised advantage estimation on ``[T, N]`` rollouts (or ``[..., T, N]``: rollouts side
by side), with terminated vs truncated."""

from __future__ import annotations

import numpy as np
import torch

from klppo.core._checks import check_same_shape
from klppo.core.names import NormScope

__all__ = ["NormScope", "gae", "normalize_advantage"]


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    gamma: float = 0.99,
    lam: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE(gamma, lambda) advantages and lambda-returns.

    Leading dimensions are rollouts side by side (``[R, T, N]``: R runs' rollouts, the engine's
    stacked buffer): every operation is elementwise, so each rollout's numbers are those it
    gets alone.

    Args:
        rewards: ``[T, N]`` reward received after the action at step t.
        values: ``[T, N]`` ``V(s_t)``.
        next_values: ``[T, N]`` value of the observation that followed step t: ``V(s_{t+1})``,
            or ``V(final observation)`` when the episode was truncated at t (time limit). Its
            entry is ignored where ``terminated`` is set.
        terminated: ``[T, N]`` bool: the episode ended in a terminal state at t (no bootstrap).
        truncated: ``[T, N]`` bool: the episode was cut at t (bootstrap from ``next_values``).
        gamma: discount in [0, 1]. lam: GAE lambda in [0, 1].

    Returns:
        ``(advantages, returns)`` of shape ``[T, N]`` (``[..., T, N]``),
        ``returns = advantages + values``, with
        ``delta_t = r_t + gamma (1 - term_t) next_v_t - v_t`` and
        ``A_t = delta_t + gamma lam (1 - (term_t or trunc_t)) A_{t+1}``: the lambda trace is cut
        at either kind of episode end.
    """
    check_same_shape(
        rewards=rewards, values=values, next_values=next_values,
        terminated=terminated, truncated=truncated,
    )
    if rewards.dim() < 2:
        raise ValueError(f"gae expects [T, N] (or [..., T, N]) tensors, got shape "
                         f"{tuple(rewards.shape)}")
    for name, v in (("gamma", gamma), ("lam", lam)):
        if not 0.0 <= float(v) <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {name}={v!r}")
    term = terminated.to(rewards.dtype)
    cont = 1.0 - torch.maximum(term, truncated.to(rewards.dtype))
    deltas = rewards + gamma * (1.0 - term) * next_values - values
    decay = gamma * lam * cont
    adv = torch.empty_like(rewards)
    if (adv.device.type == "cpu" and adv.dtype in (torch.float32, torch.float64)
            and not (deltas.requires_grad or decay.requires_grad)):
        # the same float operations on numpy views of the tensors, a tenth of the per-call cost
        d, k, a = deltas.numpy(), decay.numpy(), adv.numpy()
        last = np.zeros_like(a[..., 0, :])
        for t in range(a.shape[-2] - 1, -1, -1):
            last = d[..., t, :] + k[..., t, :] * last
            a[..., t, :] = last
        return adv, adv + values
    after = torch.zeros_like(rewards[..., 0, :])
    for t in range(rewards.shape[-2] - 1, -1, -1):
        after = deltas[..., t, :] + decay[..., t, :] * after
        adv[..., t, :] = after
    return adv, adv + values


def normalize_advantage(advantage: torch.Tensor, eps: float = 1e-8,
                        rows: bool = False) -> torch.Tensor:
    """``(A - mean) / (std + eps)`` over all entries, with the sample std (torch's default, as
    in CleanRL and SB3). A single sample is returned centred (0). Takes a torch tensor or a
    numpy array (the numpy fast path) and returns the same kind. ``rows=True`` (``[A, n]``, the
    rows of a stack): each row over its own entries, the numbers of each row alone."""
    if rows:
        if advantage.ndim != 2:
            raise ValueError("normalize_advantage(rows=True) takes a 2-D array [A, n]")
        if isinstance(advantage, np.ndarray):
            m = advantage.mean(-1, keepdims=True)
            if advantage.shape[-1] < 2:
                return advantage - m
            return (advantage - m) / (advantage.std(-1, ddof=1, keepdims=True) + np.float32(eps))
        mt = advantage.mean(-1, keepdim=True)
        if advantage.shape[-1] < 2:
            return advantage - mt
        return (advantage - mt) / (advantage.std(-1, keepdim=True) + eps)
    if isinstance(advantage, np.ndarray):
        if advantage.size < 2:
            return advantage - advantage.mean()
        return (advantage - advantage.mean()) / (advantage.std(ddof=1) + np.float32(eps))
    if advantage.numel() < 2:
        return advantage - advantage.mean()
    return (advantage - advantage.mean()) / (advantage.std() + eps)
