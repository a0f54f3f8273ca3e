"""A KL monitor: warns when the observed KL stays far from its target, or is impossible.

The adaptive-KL RLHF tutorial warns when the KL is too high (above twice the target), too low
(below half) or negative; :class:`KLMonitor` does the same for any controller and unit, with the
thresholds and the patience (consecutive updates) configurable. A KL to a fixed reference
starts at 0 and ramps up, so "too low" can be held back for a warm-up: it is not counted until
the KL has first reached ``low * target`` or ``warmup`` updates have passed, whichever comes
first (``warmup=0``: counted from the first update). It only returns what it found
(pure, no logging): the training loops log the message and record the flags in their metrics.
Its state is checkpointed so a resumed run raises the same flags.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["KLAlarm", "KLMonitor"]


@dataclass(frozen=True)
class KLAlarm:
    """Flags after one update, and a message when one of them newly fired."""

    high: bool
    low: bool
    negative: bool
    message: str | None

    def as_metrics(self) -> dict[str, float]:
        return {"kl_alarm_high": float(self.high), "kl_alarm_low": float(self.low),
                "kl_alarm_negative": float(self.negative)}


class KLMonitor:
    """``update(kl)`` after every controller update.

    Args:
        target: the KL target (None: only the sign is checked).
        high, low: the KL is "too high" above ``high * target``, "too low" below
            ``low * target`` (the tutorial's 2 and 0.5).
        patience: consecutive updates a condition must hold before its flag is raised.
        unit: the KL's unit, for the message (e.g. "nats per sample").
        warmup: updates during which "too low" is not counted unless the KL has already
            reached ``low * target`` (0: counted from the first update).
    """

    def __init__(self, target: float | None, high: float = 2.0, low: float = 0.5,
                 patience: int = 3, unit: str = "nats", warmup: int = 0) -> None:
        if not (high > 1 and 0 < low < 1 and int(patience) >= 1 and int(warmup) >= 0):
            raise ValueError(f"KLMonitor: need high > 1, 0 < low < 1, patience >= 1, "
                             f"warmup >= 0, got high={high!r}, low={low!r}, "
                             f"patience={patience!r}, warmup={warmup!r}")
        self.target, self.high, self.low = target, float(high), float(low)
        self.patience, self.unit, self.warmup = int(patience), unit, int(warmup)
        self.above = self.below = 0
        self.updates, self.reached = 0, False

    def update(self, kl: float) -> KLAlarm:
        """Count one controller update that measured ``kl`` (in the monitor's unit)."""
        negative = kl < 0 or math.isnan(kl)
        t = self.target
        self.updates += 1
        self.reached = self.reached or (t is not None and kl >= self.low * t)
        armed = self.reached or self.updates > self.warmup
        self.above = self.above + 1 if t is not None and kl > self.high * t else 0
        self.below = self.below + 1 if armed and t is not None and kl < self.low * t else 0
        high, low = self.above >= self.patience, self.below >= self.patience
        message = None
        if negative:
            message = (f"KL estimate {kl:.4g} {self.unit} is negative: a KL cannot be (a "
                       f"high-variance or biased estimator? try k3)")
        elif self.above == self.patience:
            message = (f"KL {kl:.4g} {self.unit} has stayed above {self.high:g}x its target "
                       f"{t:g} for {self.patience} updates: beta is too small or moves too "
                       f"slowly")
        elif self.below == self.patience:
            message = (f"KL {kl:.4g} {self.unit} has stayed below {self.low:g}x its target "
                       f"{t:g} for {self.patience} updates: beta is too large (the policy "
                       f"barely moves)")
        return KLAlarm(high, low, negative, message)

    def state_dict(self) -> dict[str, Any]:
        """The counters (a resumed run raises the same flags)."""
        return {"above": self.above, "below": self.below, "updates": self.updates,
                "reached": self.reached}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (a checkpoint from before the warm-up counts as past
        it)."""
        self.above, self.below = int(s["above"]), int(s["below"])
        self.updates = int(s.get("updates", self.warmup))
        self.reached = bool(s.get("reached", False))
