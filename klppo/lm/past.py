"""A stale sampler's past policies: the copies an RLHF experiment keeps, and the check of those a
checkpoint brings back (``staleness``)."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["cpu_copy", "checked_past"]


def _same_layout(p: Any, own: dict[str, torch.Tensor]) -> bool:
    """``p`` is a state dict with ``own``'s keys, shapes and dtypes, every value finite."""
    return isinstance(p, dict) and p.keys() == own.keys() and all(
        isinstance(p[n], torch.Tensor) and p[n].shape == t.shape and p[n].dtype == t.dtype
        and (not p[n].is_floating_point() or bool(torch.isfinite(p[n]).all()))
        for n, t in own.items())


def cpu_copy(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A detached CPU copy of a state dict (a past policy kept for a stale sampler)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}


def checked_past(past: Any, staleness: int, own: dict[str, torch.Tensor]
                 ) -> list[dict[str, torch.Tensor]]:
    """A checkpoint's past policies: none without staleness; else 1 to ``staleness + 1``
    state dicts of the policy's (``own``) keys, shapes and dtypes, finite, the last equal to the
    checkpoint's policy (loaded before them). ``ValueError`` for a forged or foreign one."""
    k = staleness
    if not k:
        if past:
            raise ValueError(f"past_policies: {len(past)} saved, but staleness=0 keeps none"
                             " (the checkpoint of a stale run?)")
        return []
    if not isinstance(past, list) or not 1 <= len(past) <= k + 1 or not all(
            _same_layout(p, own) for p in past):
        raise ValueError(f"past_policies: not 1 to {k + 1} finite state dicts of the "
                         f"policy's parameters (written without staleness {k}?)")
    if not all(torch.equal(past[-1][n], t.detach().cpu()) for n, t in own.items()):
        raise ValueError("past_policies: the last is not the checkpoint's policy (a "
                         "checkpoint klppo writes always ends with it): damaged or forged")
    return past
