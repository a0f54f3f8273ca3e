"""The KLip-PPO evaluation protocol, torch-free (shared by the trainer and the report)."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["final_return"]


def final_return(records: list[dict[str, Any]], fraction: float = 0.1,
                 policy: str | None = None) -> float:
    """Mean return of the training episodes that ended in the last ``fraction`` of the steps.

    Each iteration's ``episode_return_mean`` is weighted by its ``episode_count`` (so this is the
    mean over episodes, not over iterations). nan when no episode ended in that window.
    ``policy``: a multi-agent run's policy (its ``policy/episode_return_mean``, the mean over
    its agents).
    """
    key = "episode_return_mean" if policy is None else f"{policy}/episode_return_mean"
    if not records:
        return math.nan
    last = max(r["global_step"] for r in records)
    cut = last * (1 - fraction)
    total = count = 0.0
    for r in records:
        n = r.get("episode_count") or 0
        if r["global_step"] > cut and n and r.get(key) is not None:
            total += r[key] * n
            count += n
    return total / count if count else math.nan
