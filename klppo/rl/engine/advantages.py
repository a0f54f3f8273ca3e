"""The advantages of a group's rollouts: GAE once over every rollout of one shape and one
``(gamma, lambda)``, side by side (:func:`klppo.core.advantages.gae` on ``[A, T, N]``).

GAE is elementwise, so each rollout's advantages are those it gets alone
(``tests/core/test_advantages.py``); what grouping saves is the per-call cost of the time loop,
paid once per group of rollouts instead of once per run.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from klppo.core.advantages import gae

__all__ = ["group_gae", "GAE_FIELDS"]

#: the rollout fields GAE reads, in :func:`~klppo.core.advantages.gae`'s order
GAE_FIELDS = ("rewards", "values", "next_values", "terminated", "truncated")


def group_gae(rollouts: list[tuple[Any, Any]]
              ) -> list[tuple[torch.Tensor, torch.Tensor] | Exception]:
    """Per ``(ppo, buffer)`` of ``rollouts`` (its :class:`~klppo.rl.config.PPOConfig` and its
    ``[T, N]`` :class:`~klppo.rl.rollout.RolloutBuffer`), its ``(advantages, returns)``
    ``[T, N]``, or the error its rollout alone raises (a non-finite value): the others' are
    computed all the same. The rollouts that share a shape, dtype, device, gamma and lambda go
    in one call."""
    groups: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for k, (ppo, buf) in enumerate(rollouts):
        r = buf.rewards
        groups[(tuple(r.shape), r.dtype, r.device, ppo.gamma, ppo.gae_lambda)].append(k)
    out: list[Any] = [None] * len(rollouts)
    for (*_, gamma, lam), ks in groups.items():
        bufs = [rollouts[k][1] for k in ks]
        try:
            if len(ks) == 1:
                out[ks[0]] = _gae([getattr(bufs[0], f) for f in GAE_FIELDS], gamma, lam)
                continue
            adv, ret = _gae([torch.stack([getattr(b, f) for b in bufs]) for f in GAE_FIELDS],
                            gamma, lam)
            for a, k in enumerate(ks):
                out[k] = (adv[a], ret[a])
        except Exception:  # noqa: BLE001 - a rollout of the group is bad: each one alone
            for k, b in zip(ks, bufs):
                out[k] = _alone(b, gamma, lam)
    return out


def _alone(buf: Any, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor] | Exception:
    """One rollout's GAE, or the error it raises (its own message and index)."""
    try:
        return _gae([getattr(buf, f) for f in GAE_FIELDS], gamma, lam)
    except Exception as e:  # noqa: BLE001 - returned to its run, which alone stops
        return e


def _gae(x: list[torch.Tensor], gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    rewards, values, next_values, terminated, truncated = x
    return gae(rewards, values, next_values, terminated, truncated, gamma, lam)
