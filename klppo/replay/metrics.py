"""How a controller did: tracking metrics of a KL trace against a target (closed loop), and
how a controller's beta responded to a KL trace it cannot change (open loop).

Open loop, the KL trace is the same for every controller, so its tracking of a target describes
the trace, not the controller; :func:`response_metrics` describes each controller instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["FLOOR", "tracking_metrics", "response_metrics"]

#: the smallest KL / target the tracking error counts (a KL at or below 0 is 1000x too low)
FLOOR = 1e-3


def tracking_metrics(kl: Sequence[float], beta: Sequence[float], target: float | None,
                     beta_min: float, beta_max: float, band: float = 0.5,
                     window: int = 5) -> dict[str, float | None]:
    """How well a KL trace tracks its target.

    * ``tracking_error``: mean ``|log(KL / target)|`` over the second half (0 is perfect;
      0.69 means off by a factor of 2 on average); a KL below ``FLOOR * target`` (a noisy
      estimate can be 0 or negative) counts as ``FLOOR * target``, 1000 times too low;
    * ``overshoot``: the largest ``KL / target - 1`` after the KL first comes within the band;
    * ``settling_time``: the first step from which the moving median (``window`` steps) of
      ``KL / target`` stays within ``1 +- band`` to the end (None if it never does);
    * ``time_at_bounds``: the share of steps with beta at ``beta_min`` or ``beta_max``.
    """
    k = np.asarray(kl, float)
    b = np.asarray(beta, float)
    out: dict[str, float | None] = {}
    at_bounds = np.isclose(b, beta_min, rtol=1e-9, atol=0) | np.isclose(b, beta_max, rtol=1e-9,
                                                                          atol=0)
    out["time_at_bounds"] = float(at_bounds.mean()) if len(b) else None
    if target is None or len(k) == 0:
        return {"tracking_error": None, "overshoot": None, "settling_time": None, **out}
    with np.errstate(over="ignore"):  # a KL logged as 1e308 (+inf) is off by a factor inf
        rel = k / target
        half = np.maximum(rel[len(rel) // 2:], FLOOR)
        out["tracking_error"] = float(np.mean(np.abs(np.log(half))))
    inside = np.flatnonzero(np.abs(rel - 1) <= band)
    out["overshoot"] = float(max(0.0, (rel[inside[0]:] - 1).max())) if len(inside) else None
    med = np.array([np.median(rel[max(0, i - window + 1):i + 1]) for i in range(len(rel))])
    ok = np.abs(med - 1) <= band
    bad = np.flatnonzero(~ok)
    if not ok[-1]:
        out["settling_time"] = None
    else:
        out["settling_time"] = float(bad[-1] + 1) if len(bad) else 0.0
    return out


def response_metrics(kl: Sequence[float], beta: Sequence[float], target: float | None,
                     beta_min: float, beta_max: float) -> dict[str, float | None]:
    """How one controller's beta answered a KL trace (open loop). ``beta`` has one value more
    than ``kl``: the beta before the first update, then the beta after each.

    * ``moves``: the share of updates that changed beta;
    * ``right_way``: of the moves where the KL was off target, the share in the direction that
      corrects it (beta up when the KL is above the target, down when below); None if none;
    * ``reversals``: changes of direction of beta per 100 updates (chatter);
    * ``decades``: ``log10(max beta / min beta)`` over the positive betas (the range it swept);
      None with fewer than two positive betas;
    * ``time_at_bounds``: the share of updates after which beta sits at ``beta_min`` or
      ``beta_max``.
    """
    k = np.asarray(kl, float)
    b = np.asarray(beta, float)
    if len(b) != len(k) + 1:
        raise ValueError(f"beta has {len(b)} values for {len(k)} KL values: give the beta "
                         "before the first update too")
    step = np.diff(b)
    moved = step != 0
    out: dict[str, float | None] = {"moves": float(moved.mean()) if len(k) else None}
    if target is not None:
        off = moved & (k != target)
        out["right_way"] = (float((np.sign(step[off]) == np.sign(k[off] - target)).mean())
                            if off.any() else None)
    else:
        out["right_way"] = None
    signs = np.sign(step[moved])
    out["reversals"] = (100.0 * float((signs[1:] != signs[:-1]).sum()) / len(k)
                        if len(k) else None)
    pos = b[b > 0]
    out["decades"] = float(math.log10(pos.max() / pos.min())) if len(pos) >= 2 else None
    after = b[1:]
    at = np.isclose(after, beta_min, rtol=1e-9, atol=0) | np.isclose(after, beta_max,
                                                                      rtol=1e-9, atol=0)
    out["time_at_bounds"] = float(at.mean()) if len(after) else None
    return out
