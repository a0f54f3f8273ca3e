"""Controllers on a bound: BAPO's adaptive clip bounds, one rule, replayable.

BAPO (Xi et al. 2025, "BAPO: Stabilizing Off-Policy Reinforcement Learning for LLMs via Balanced
Policy Optimization with Adaptive Clipping", arXiv:2510.18927, section 4.2, Eq. 8 and Algorithm 1)
chooses the PPO-Clip bounds ``[c_low, c_high]`` of the ratio afresh before every policy update, so
that the positive-advantage samples carry at least a share ``rho_0`` of the surrogate::

    P(c_high) = sum_{A>0} min(w A, clip(w, 0, c_high) A)        = sum_{A>0} A min(w, c_high)
    N(c_low)  = sum_{A<0} |min(w A, clip(w, c_low, c_high) A)|  = sum_{A<0} |A| max(w, c_low)
    rho(c_low, c_high) = P / (P + N)                            (1 when N = 0)

    c_low, c_high = a-, a+                                   # Algorithm 1, line 9: every update
    while rho(c_low, c_high) < rho_0 and c_low + d2 <= b-:   # line 10
        if c_high + d1 <= b+: c_high = c_high + d1           # lines 12-13: the upper bound first
        else:                 c_low = c_low + d2             # line 15
    J = mean min(w A, clip(w, c_low, c_high) A)              # line 20: PPO-Clip in those bounds

``w = pi_theta(a|s) / pi_rollout(a|s)`` per sample (dimensionless, at the parameters about to be
stepped), ``A`` the advantage the objective sees (any unit: ``rho`` does not change when every
``A`` is scaled by the same positive factor); sums run over the samples of the update's batch (a
minibatch in klppo's trainer). klppo's band radii are ``eps_low = 1 - c_low`` and
``eps_high = c_high - 1``. Defaults: the paper's section 5 ("Implementation details"):
``rho_0 = 0.4``, ``[a-, b-] = [0.6, 0.9]``, ``[a+, b+] = [1.2, 3.0]``, ``d1 = 0.05``, ``d2 = 0.02``.

Readings of the text, stated because the paper leaves them open:

* Eq. 8 prints ``|sum_{A>0} ...| / |sum_A ...|`` with a ``pi_rollout(y_t)`` weight, the
  expectation written as a sum over tokens (as in its Eq. 5). On a sampled batch the weight is the
  sampling itself, and the denominator is read as the positive plus the negative *magnitudes*,
  ``P + N``: the authors' verl recipe (github.com/WooooDyy/BAPO, ``recipe/bapo/policy_loss.py``)
  computes exactly these ``P`` and ``N`` and compares ``P / N`` with a target of 1, i.e.
  ``rho >= 0.5`` (its README: ``rho_0 = 0.5``). With no negative contribution (``N = 0``) the
  target counts as met, as there (``P / N = inf``).
* The loop's arithmetic is exact on the grid the hyperparameters define: the bounds visited are
  ``a + k d`` for ``k = 0 .. n``, ``n`` the largest with ``a + n d <= b``, each rounded to 12
  decimals. Float accumulation (``c += d``) would stop ``c_low`` at 0.88 with the defaults and
  never reach ``b- = 0.9``.
* Under Eq. 8 raising ``c_low`` never raises ``rho``: a negative sample with ``w < c_low`` counts
  ``|A| c_low > |A| w``. So once ``c_high`` is at ``b+`` with the target unmet, the loop walks
  ``c_low`` to ``b-`` (the result is either ``(a-, first c_high that meets rho_0)`` or
  ``(b-, b+)``). The verl recipe, which raises ``c_low`` first, has the same property. A reading
  by gradient (Eq. 5: a clipped sample contributes nothing) would make ``c_low`` lower the
  negative share; it is not what Eq. 8 or the authors' code compute, and klppo does not offer it.
* The rule has no memory across updates (line 9 resets the bounds); the controller's state is the
  last result and its record, checkpointed for the logs.

:class:`BalanceStats` holds what the rule reads (a batch's ``w`` and ``A`` split by the sign of
``A``, float64); :class:`BAPOController` is the rule. The training loop
(:mod:`klppo.rl.band_control`) feeds it one batch per minibatch step;
:func:`klppo.replay.lab.replay_bounds` replays it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np

__all__ = ["BalanceStats", "BapoInfo", "BAPOController", "positive_share", "BAPO_DEFAULTS"]

#: the paper's section 5 settings: target share, [a-, b-], [a+, b+], step of c_high, step of c_low
BAPO_DEFAULTS: dict[str, Any] = {"target": 0.4, "low": (0.6, 0.9), "high": (1.2, 3.0),
                                 "step_high": 0.05, "step_low": 0.02}


def _array(name: str, x: Any) -> np.ndarray:
    """``x`` (a torch tensor or array-like) as a 1-d float64 array, finite, else ValueError."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-d array of per-sample values, got shape "
                         f"{a.shape}")
    if not np.isfinite(a).all():
        i = int(np.flatnonzero(~np.isfinite(a))[0])
        raise ValueError(f"{name} holds a non-finite value at index {i}: {a[i]!r}")
    return a


@dataclass(frozen=True)
class BalanceStats:
    """One batch's per-sample ratios and advantages, split by the sign of the advantage (float64):
    all BAPO's share reads, at any candidate bounds. Build it with :meth:`from_samples`."""

    pos_adv: np.ndarray
    """``A`` of the samples with ``A > 0``."""
    pos_ratio: np.ndarray
    """their ``w = pi_theta / pi_rollout``."""
    neg_adv: np.ndarray
    """``|A|`` of the samples with ``A < 0``."""
    neg_ratio: np.ndarray
    """their ``w``."""

    @classmethod
    def from_samples(cls, ratio: Any, advantage: Any) -> BalanceStats:
        """From per-sample ``ratio`` (``w >= 0``) and ``advantage`` of one shape ``[n]`` (torch
        tensors or arrays); ValueError for other shapes, a non-finite value or a negative ratio."""
        w, a = _array("ratio", ratio), _array("advantage", advantage)
        if w.shape != a.shape:
            raise ValueError(f"ratio has shape {w.shape} but advantage has shape {a.shape}")
        if (w < 0).any():
            raise ValueError(f"ratio must be >= 0 (pi_theta / pi_rollout), got {w.min()!r}")
        pos, neg = a > 0, a < 0
        return cls(a[pos], w[pos], -a[neg], w[neg])

    def contributions(self, c_low: float, c_high: float) -> tuple[float, float]:
        """``(P, N)`` of Eq. 8 at the bounds: ``sum_{A>0} A min(w, c_high)`` and
        ``sum_{A<0} |A| max(w, c_low)`` (the advantage's unit times the ratio's, summed)."""
        p = float(np.sum(self.pos_adv * np.minimum(self.pos_ratio, c_high)))
        n = float(np.sum(self.neg_adv * np.maximum(self.neg_ratio, c_low)))
        return p, n

    def share(self, c_low: float, c_high: float) -> float:
        """``rho = P / (P + N)`` at the bounds, in ``[0, 1]``; 1 when ``N = 0``."""
        return _share(*self.contributions(c_low, c_high))

    def profile(self, lows: Any, highs: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(N at each c_low of lows, P at each c_high of highs)`` in one pass each: the
        samples sorted by ratio, ``P(c) = sum_{w<c} A w + c sum_{w>=c} A`` and
        ``N(c) = c sum_{w<c} |A| + sum_{w>=c} |A| w`` from prefix and suffix sums (the same
        values as :meth:`contributions` up to rounding, in O(log n) per bound)."""
        highs, lows = np.asarray(highs, np.float64), np.asarray(lows, np.float64)
        w, a = _by_ratio(self.pos_ratio, self.pos_adv)
        k = np.searchsorted(w, highs, side="left")
        p = _prefix(a * w)[k] + highs * _suffix(a)[k]
        w, a = _by_ratio(self.neg_ratio, self.neg_adv)
        k = np.searchsorted(w, lows, side="left")
        n = lows * _prefix(a)[k] + _suffix(a * w)[k]
        return n, p


def _by_ratio(w: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(w, kind="stable")
    return w[order], a[order]


def _prefix(x: np.ndarray) -> np.ndarray:
    """``[0, x0, x0 + x1, ..., sum x]`` (length n + 1)."""
    return np.concatenate(([0.0], np.cumsum(x)))


def _suffix(x: np.ndarray) -> np.ndarray:
    """``[sum x, sum x[1:], ..., x[-1], 0]`` (length n + 1), summed from the end."""
    return np.concatenate((np.cumsum(x[::-1])[::-1], [0.0]))


def _share(p: float, n: float) -> float:
    return 1.0 if n == 0 else p / (p + n)


def positive_share(ratio: Any, advantage: Any, c_low: float, c_high: float) -> float:
    """BAPO's positive share ``rho`` (Eq. 8) of per-sample ``ratio`` and ``advantage`` at the
    ratio bounds ``[c_low, c_high]``; see the module docstring."""
    return BalanceStats.from_samples(ratio, advantage).share(c_low, c_high)


@dataclass(frozen=True)
class BapoInfo:
    """What one BAPO update saw and chose."""

    share_start: float
    """``rho`` at the start bounds ``(a-, a+)``."""
    share: float
    """``rho`` at the chosen bounds."""
    c_low: float
    c_high: float
    moves: int
    """steps the loop took (0: the start bounds met the target)."""
    met: bool
    """``share >= target``."""

    def as_dict(self) -> dict[str, Any]:
        """The fields as a plain dict."""
        return asdict(self)


def _number(name: str, v: Any, lo: float, hi: float, text: str) -> float:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if not (ok and lo < v <= hi):
        raise ValueError(f"{name}={v!r}: {text}")
    return float(v)


def _range(name: str, v: Any, lo: float, hi: float, text: str) -> tuple[float, float]:
    if not (isinstance(v, (tuple, list)) and len(v) == 2):
        raise ValueError(f"{name}={v!r}: must be a pair (start, max)")
    a, b = (_number(name, x, lo, hi, text) for x in v)
    if a > b:
        raise ValueError(f"{name}={tuple(v)!r}: the start must not exceed the max")
    return a, b


#: the most bounds a range may hold: Algorithm 1 scans them every minibatch, so a step that
#: makes millions of them (1e-12 over a range of 1.8) would stall training, and building the
#: list would exhaust memory first (the paper's ranges hold 16 and 37)
MAX_GRID = 10_000


def _grid(name: str, a: float, b: float, step: float) -> list[float]:
    """``a + k step`` for ``k = 0 .. n`` (``n`` the largest with ``a + n step <= b``, to a 1e-9
    step tolerance), each rounded to 12 decimals; ValueError naming ``name`` (the step) when
    that is more than :data:`MAX_GRID` bounds, before any is made."""
    n = math.floor((b - a) / step + 1e-9)
    if n + 1 > MAX_GRID:
        raise ValueError(f"{name}={step!r}: makes {n + 1:,} bounds over ({a:g}, {b:g}); at most "
                         f"{MAX_GRID:,} (Algorithm 1 scans them every minibatch)")
    return [round(a + k * step, 12) for k in range(n + 1)]


class BAPOController:
    """BAPO's adaptive clip bounds (Algorithm 1 of arXiv:2510.18927; the module docstring).

    Args:
        target: ``rho_0``, the positive share to reach, in ``(0, 1]`` (paper: 0.4).
        low: ``(a-, b-)``, the range of ``c_low``, ``0 < a- <= b- < 1`` (paper: (0.6, 0.9)).
        high: ``(a+, b+)``, the range of ``c_high``, ``1 < a+ <= b+`` (paper: (1.2, 3.0)).
        step_high: ``d1``, the step of ``c_high`` (paper: 0.05).
        step_low: ``d2``, the step of ``c_low`` (paper: 0.02); ``b- - a-`` must allow one step,
            since the paper's loop runs only while ``c_low`` can still step.

    A bad setting is a ValueError whose message starts with the argument's name.
    """

    name: ClassVar[str] = "bapo"

    def __init__(self, target: float = 0.4, low: tuple[float, float] = (0.6, 0.9),
                 high: tuple[float, float] = (1.2, 3.0), step_high: float = 0.05,
                 step_low: float = 0.02) -> None:
        self.target = _number("target", target, 0.0, 1.0, "must be in (0, 1]")
        self.low = _range("low", low, 0.0, 1.0 - 1e-12, "c_low must be in (0, 1)")
        self.high = _range("high", high, 1.0, math.inf, "c_high must be finite and > 1")
        self.step_high = _number("step_high", step_high, 0.0, math.inf, "must be finite and > 0")
        self.step_low = _number("step_low", step_low, 0.0, math.inf, "must be finite and > 0")
        self._lows = _grid("step_low", *self.low, self.step_low)
        self._highs = _grid("step_high", *self.high, self.step_high)
        if len(self._lows) < 2:
            raise ValueError(f"low={self.low!r}: b- - a- must allow one step of step_low="
                             f"{self.step_low!r} (Algorithm 1 runs only while c_low can step)")
        self.num_updates = 0
        self.info: BapoInfo | None = None

    def settings(self) -> dict[str, Any]:
        """The rule's settings (what a state_dict must have been made with)."""
        return {"target": self.target, "low": self.low, "high": self.high,
                "step_high": self.step_high, "step_low": self.step_low}

    @property
    def bounds(self) -> tuple[float, float]:
        """``(c_low, c_high)`` of the last update (the start bounds before the first)."""
        if self.info is None:
            return self._lows[0], self._highs[0]
        return self.info.c_low, self.info.c_high

    @property
    def edges(self) -> tuple[float, float]:
        """The band radii of :attr:`bounds`: ``(eps_low, eps_high) = (1 - c_low, c_high - 1)``."""
        c_low, c_high = self.bounds
        return 1.0 - c_low, c_high - 1.0

    def update(self, stats: BalanceStats) -> tuple[float, float]:
        """Run Algorithm 1 on one batch's statistics; return the chosen ``(c_low, c_high)``."""
        n, p = (v.tolist() for v in stats.profile(self._lows, self._highs))
        i = j = moves = 0
        share = start = _share(p[0], n[0])
        while share < self.target and j + 1 < len(self._lows):
            if i + 1 < len(self._highs):
                i += 1
            else:
                j += 1
            moves += 1
            share = _share(p[i], n[j])
        self.info = BapoInfo(start, share, self._lows[j], self._highs[i], moves,
                             share >= self.target)
        self.num_updates += 1
        return self.bounds

    def state_dict(self) -> dict[str, Any]:
        """The settings, the update count and the last record (the rule keeps nothing else)."""
        return {"name": self.name, "settings": self.settings(), "num_updates": self.num_updates,
                "info": None if self.info is None else self.info.as_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output; ValueError for another rule's or settings' state."""
        if state.get("name") != self.name:
            raise ValueError(f"state_dict is for {state.get('name')!r}, not {self.name!r}")
        saved = {k: tuple(v) if isinstance(v, list) else v
                 for k, v in dict(state.get("settings") or {}).items()}
        if saved != self.settings():
            raise ValueError(f"state_dict was made with settings {saved!r}, not "
                             f"{self.settings()!r}")
        self.num_updates = int(state["num_updates"])
        self.info = None if state.get("info") is None else BapoInfo(**state["info"])

    def __repr__(self) -> str:
        return (f"BAPOController(target={self.target}, low={self.low}, high={self.high}, "
                f"step_high={self.step_high}, step_low={self.step_low})")
