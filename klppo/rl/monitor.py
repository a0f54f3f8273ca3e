"""Warnings for a run that is going wrong without failing: a value loss or KL that explodes."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from typing import Any

__all__ = ["ExplosionMonitor", "PerPolicyMonitor"]


class ExplosionMonitor:
    """Flags a metric that is orders of magnitude off.

    ``check(m)`` returns one message per problem: a watched metric more than ``factor`` times
    the median of its last ``window`` values; a value loss more than ``factor`` times the mean
    square of its targets (``value_target_rms``, at least 1), which no working critic reaches;
    a rollout KL above ``max_kl`` nats per sample (a policy that left any trust region). A KL
    jump counts only above ``min_kl`` nats per sample. The typical cause is a learning rate
    that is far too high. The history
    comes from the metrics themselves, so a resumed run warns exactly where the uninterrupted
    one would (:meth:`seed` replays the kept records).
    """

    def __init__(self, keys: tuple[str, ...] = ("value_loss", "kl_rollout"),
                 factor: float = 1000.0, window: int = 10, min_history: int = 3,
                 max_kl: float = 10.0, min_kl: float = 0.05) -> None:
        self.keys, self.factor, self.min_history = keys, factor, min_history
        self.max_kl = max_kl
        #: a KL jump counts only above this (nats per sample): from a learning rate annealed to
        #: almost 0, a run extended with a new total goes from 1e-6 to a healthy 0.005
        self.min_kl = min_kl
        self.warned: set[str] = set()  # one warning per metric and kind in a process
        self.history: dict[str, deque[float]] = {k: deque(maxlen=window) for k in keys}

    def seed(self, records: Iterable[dict[str, Any]]) -> None:
        for m in records:
            self._push(m)

    def _push(self, m: dict[str, Any]) -> None:
        for k in self.keys:
            v = m.get(k)
            if isinstance(v, (int, float)) and math.isfinite(v):
                self.history[k].append(abs(float(v)))

    def _absolute(self, m: dict[str, Any], out: _Once) -> None:
        it = m.get("iteration")
        v, rms = m.get("value_loss"), m.get("value_target_rms")
        if isinstance(v, float) and isinstance(rms, float) and v > self.factor * max(rms**2, 1):
            out.append("abs:value_loss",
                       f"iteration {it}: value_loss = {v:.3g} is over {self.factor:.3g}x the "
                       f"mean square of its targets ({rms**2:.3g}); the critic is diverging "
                       f"(learning rate too high?)")
        kl = m.get("kl_rollout")
        if isinstance(kl, float) and kl > self.max_kl:
            out.append("abs:kl_rollout",
                       f"iteration {it}: kl_rollout = {kl:.3g} nats per sample (over "
                       f"{self.max_kl:.3g}); the policy update is diverging (learning rate too "
                       f"high?)")

    def check(self, m: dict[str, Any]) -> list[str]:
        out = _Once(self.warned)
        self._absolute(m, out)
        for k in self.keys:
            v, hist = m.get(k), sorted(self.history[k])
            if not isinstance(v, (int, float)) or len(hist) < self.min_history:
                continue
            ref = hist[len(hist) // 2]
            kl = k == "kl_rollout"
            if ref > 0 and abs(v) > self.factor * ref and (not kl or abs(v) > self.min_kl):
                unit = " nats per sample" if kl else ""
                out.append(f"rel:{k}",
                           f"iteration {m.get('iteration')}: {k} = {v:.3g}{unit} is "
                           f"{abs(v) / ref:.3g}x its median over the last {len(hist)} "
                           f"iterations ({ref:.3g}{unit}); the update is diverging (learning "
                           f"rate too high?)")
        self._push(m)
        return out.messages


class _Once:
    """Collects messages, each kind once per monitor."""

    def __init__(self, seen: set[str]) -> None:
        self.seen = seen
        self.messages: list[str] = []

    def append(self, kind: str, message: str) -> None:
        if kind not in self.seen:
            self.seen.add(kind)
            self.messages.append(message)


class PerPolicyMonitor:
    """An :class:`ExplosionMonitor` per policy of a multi-agent run, on its ``policy/`` metrics;
    each message names the policy."""

    def __init__(self, policies: Iterable[str]) -> None:
        self.monitors = {p: ExplosionMonitor() for p in policies}

    @staticmethod
    def _view(m: dict[str, Any], p: str) -> dict[str, Any]:
        n = len(p) + 1
        return {"iteration": m.get("iteration"),
                **{k[n:]: v for k, v in m.items() if k.startswith(p + "/")}}

    def seed(self, records: Iterable[dict[str, Any]]) -> None:
        for m in records:
            for p, mon in self.monitors.items():
                mon.seed([self._view(m, p)])

    def check(self, m: dict[str, Any]) -> list[str]:
        return [f"policy {p}: {msg}" for p, mon in self.monitors.items()
                for msg in mon.check(self._view(m, p))]
