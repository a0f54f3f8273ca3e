"""Running normalisers of observations and rewards (per run; a group keeps the same statistics
stacked, :mod:`klppo.rl.engine.norm`)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["RunningMeanStd", "ObsNormalizer", "RewardScaler", "running_moments",
           "normalized", "scaled"]


def _clip(x: np.ndarray, lo: Any, hi: Any) -> np.ndarray:
    """``np.clip`` (NaN propagates alike) without its dispatch overhead, per step."""
    return np.minimum(np.maximum(x, lo), hi)


def running_moments(mean: Any, var: Any, count: Any, x: np.ndarray, axis: int
                    ) -> tuple[Any, Any, Any]:
    """THE running-statistics update (parallel Welford, Chan et al.): ``(mean, var, count)``
    with the batch ``x`` (its samples along ``axis``) folded in, float64. A run's
    :class:`RunningMeanStd` calls it on ``[n, *shape]`` (``axis=0``); a group's stacked
    statistics (:class:`klppo.rl.engine.norm.StackedStats`) on ``[R, n, *shape]`` (``axis=1``,
    ``count`` a column), and each row gets the numbers of its run's own object (numpy reduces
    a row of the stack as it reduces the row alone; ``tests/rl/test_engine.py``)."""
    n = x.shape[axis]
    if n == 1:  # one env (the MuJoCo presets): batch mean x, batch variance 0, bit for bit:
        # the general form's ``* n`` (n = 1) and ``+ batch_var * n`` (+ 0.0) change no bit
        delta = x[(slice(None),) * axis + (0,)] - mean
        total = count + 1
        return mean + delta / total, (var * count + delta**2 * count / total) / total, total
    batch_mean, batch_var = x.mean(axis), x.var(axis)
    delta = batch_mean - mean
    total = count + n
    m2 = var * count + batch_var * n + delta**2 * count * n / total
    return mean + delta * n / total, m2 / total, total


def normalized(x: np.ndarray, mean: Any, var: Any, clip: Any) -> np.ndarray:
    """THE observation normalisation: ``clip((x - mean) / sqrt(var + 1e-8), -clip, clip)`` as
    float32 (a run's :class:`ObsNormalizer`; a group's rows, with their statistics broadcast)."""
    return _clip((x - mean) / np.sqrt(var + 1e-8), -clip, clip).astype(np.float32)


def scaled(reward: np.ndarray, var: Any, clip: Any) -> np.ndarray:
    """THE reward scaling: ``clip(reward / sqrt(var + 1e-8), -clip, clip)`` as float32, ``var``
    the running variance of the discounted return (a run's :class:`RewardScaler`; a group's
    rows)."""
    return _clip(reward / np.sqrt(var + 1e-8), -clip, clip).astype(np.float32)


class RunningMeanStd:
    """Running mean and variance (parallel Welford / Chan et al.), float64."""

    def __init__(self, shape: tuple[int, ...] = ()) -> None:
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = 1e-4

    def update(self, x: np.ndarray) -> None:
        """Fold in the batch ``x [n, *shape]`` (:func:`running_moments`)."""
        self.mean, self.var, self.count = running_moments(self.mean, self.var, self.count, x, 0)

    def state_dict(self) -> dict[str, Any]:
        return {"mean": self.mean.copy(), "var": self.var.copy(), "count": self.count}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        """Restore; ValueError when the statistics do not fit (other shape, a negative or
        non-finite variance, a count that is not a positive number)."""
        mean, var, count = np.array(s["mean"], np.float64), np.array(s["var"], np.float64), \
            s["count"]
        if mean.shape != self.mean.shape or var.shape != self.var.shape:
            raise ValueError(f"normaliser mean / var have shapes {list(mean.shape)} / "
                             f"{list(var.shape)}, the run's {list(self.mean.shape)}")
        if not (np.isfinite(mean).all() and np.isfinite(var).all() and (var >= 0).all()):
            raise ValueError("normaliser mean / var: non-finite values or a negative variance")
        if not isinstance(count, (int, float)) or isinstance(count, bool) or \
                not 0 < count < float("inf"):
            raise ValueError(f"normaliser count={count!r}: must be a finite number > 0")
        self.mean, self.var, self.count = mean, var, float(count)


class ObsNormalizer:
    """``clip((obs - mean) / sqrt(var + 1e-8), -clip, clip)`` with running statistics."""

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0) -> None:
        self.rms = RunningMeanStd(shape)
        self.clip = clip

    def __call__(self, obs: np.ndarray, update: bool = True) -> np.ndarray:
        if update:
            self.rms.update(obs)
        return self.normalize(obs)

    def normalize(self, obs: np.ndarray) -> np.ndarray:
        return normalized(obs, self.rms.mean, self.rms.var, self.clip)


class RewardScaler:
    """Divide rewards by the running std of the discounted return (gymnasium's NormalizeReward).

    The return accumulator restarts at every episode end (terminated or truncated).
    """

    def __init__(self, num_envs: int, gamma: float, clip: float = 10.0) -> None:
        self.rms = RunningMeanStd(())
        self.ret = np.zeros(num_envs, np.float64)
        self.gamma = gamma
        self.clip = clip

    def __call__(self, reward: np.ndarray, done: np.ndarray) -> np.ndarray:
        self.ret = self.ret * self.gamma + reward
        self.rms.update(self.ret)
        out = scaled(reward, self.rms.var, self.clip)
        self.ret[done] = 0.0
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"rms": self.rms.state_dict(), "ret": self.ret.copy()}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        ret = np.array(s["ret"], np.float64)
        if ret.shape != self.ret.shape or not np.isfinite(ret).all():
            raise ValueError(f"reward_scaler.ret has shape {list(ret.shape)}, the run's "
                             f"{list(self.ret.shape)} finite returns")
        self.rms.load_state_dict(s["rms"])
        self.ret = ret
