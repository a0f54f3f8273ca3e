"""The advantages of a group's rollouts: GAE once over every rollout of one shape and one
``(gamma, lambda)``, side by side (:func:`klppo.core.advantages.gae` on ``[A, T, N]``), written
into each rollout's buffer (``advantages``, ``returns``).

GAE is elementwise, so each rollout's advantages are those it gets alone
(``tests/core/test_advantages.py``); what grouping saves is the per-call cost of the time loop,
paid once per group of rollouts instead of once per run. The rollouts of a stack's runs are the
rows of one stacked buffer (the lock-step collection's): when a group is all of them, GAE reads
and writes that buffer itself, with no stacked copy.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from klppo.core.advantages import gae
from klppo.rl.rollout import RolloutBuffer, stacked_of

__all__ = ["group_gae", "whole", "GAE_FIELDS"]

#: the rollout fields GAE reads, in :func:`~klppo.core.advantages.gae`'s order
GAE_FIELDS = ("rewards", "values", "next_values", "terminated", "truncated")


def group_gae(rollouts: list[tuple[Any, RolloutBuffer]]) -> list[Exception | None]:
    """Per ``(ppo, buffer)`` of ``rollouts`` (its :class:`~klppo.rl.config.PPOConfig` and its
    ``[T, N]`` buffer): its advantages and returns written into the buffer, or the error its
    rollout alone raises (a non-finite value), the others' written all the same. The rollouts
    that share a shape, dtype, device, gamma and lambda go in one call."""
    groups: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for k, (ppo, buf) in enumerate(rollouts):
        r = buf.rewards
        groups[(tuple(r.shape), r.dtype, r.device, ppo.gamma, ppo.gae_lambda)].append(k)
    out: list[Exception | None] = [None] * len(rollouts)
    for (*_, gamma, lam), ks in groups.items():
        bufs = [rollouts[k][1] for k in ks]
        try:
            _together(bufs, gamma, lam)
        except Exception:  # noqa: BLE001 - a rollout of the group is bad: each one alone
            for k, b in zip(ks, bufs):
                out[k] = _alone(b, gamma, lam)
    return out


def whole(bufs: list[RolloutBuffer]) -> RolloutBuffer | None:
    """The stacked buffer whose rows are exactly ``bufs`` (in any order), or None."""
    parent = stacked_of(bufs)
    if parent is None or len(bufs) != parent.rewards.shape[0]:
        return None
    rows = {b.stacked[1] for b in bufs if b.stacked is not None}
    return parent if len(rows) == len(bufs) else None


def _together(bufs: list[RolloutBuffer], gamma: float, lam: float) -> None:
    one = bufs[0] if len(bufs) == 1 else whole(bufs)
    if one is not None:  # a rollout, or a stack's whole stacked rollout: in place
        _store(one, _gae([getattr(one, f) for f in GAE_FIELDS], gamma, lam))
        return
    adv, ret = _gae([torch.stack([getattr(b, f) for b in bufs]) for f in GAE_FIELDS], gamma, lam)
    for a, b in enumerate(bufs):
        _store(b, (adv[a], ret[a]))


def _alone(buf: RolloutBuffer, gamma: float, lam: float) -> Exception | None:
    """One rollout's GAE into its buffer, or the error it raises (its own message and index)."""
    try:
        _store(buf, _gae([getattr(buf, f) for f in GAE_FIELDS], gamma, lam))
    except Exception as e:  # noqa: BLE001 - returned to its run, which alone stops
        return e
    return None


def _store(buf: RolloutBuffer, adv_ret: tuple[torch.Tensor, torch.Tensor]) -> None:
    buf.advantages.copy_(adv_ret[0])
    buf.returns.copy_(adv_ret[1])


def _gae(x: list[torch.Tensor], gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    rewards, values, next_values, terminated, truncated = x
    return gae(rewards, values, next_values, terminated, truncated, gamma, lam)
