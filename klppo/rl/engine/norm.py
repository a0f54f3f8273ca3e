"""The running statistics of a stack's runs as ``[R, ...]`` arrays, for one rollout at a time.

Each run keeps its own :class:`~klppo.rl.envs.ObsNormalizer` and
:class:`~klppo.rl.envs.RewardScaler` (checkpointed with it); the lock-step collection
(:mod:`~klppo.rl.engine.collect`) gathers their state into a :class:`StackedStats` at the start
of a rollout, updates all rows with one call per step, and scatters the state back at its end.
The update is the runs' own (:func:`klppo.rl.normalize.running_moments`, on the rows' axis):
every operation is elementwise per row or a reduction over one row's own axis in the order the
run's own object reduces (numpy reduces a row of a stack as it reduces the row alone), so each
row gets its own object's numbers bit for bit (``tests/rl/test_engine.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from klppo.rl.envs import RunningMeanStd
from klppo.rl.normalize import running_moments

__all__ = ["StackedStats"]


class StackedStats:
    """R :class:`~klppo.rl.envs.RunningMeanStd` of one shape as ``mean``, ``var`` ``[R,
    *shape]`` and ``count`` (float64, as each run's; ``count`` as a column ``[R, 1, ...]`` that
    broadcasts against a row's statistics)."""

    def __init__(self, R: int, shape: tuple[int, ...]) -> None:
        self.mean = np.zeros((R, *shape), np.float64)
        self.var = np.ones((R, *shape), np.float64)
        self.count = np.full((R,) + (1,) * len(shape), 1e-4, np.float64)

    def gather(self, stats: dict[int, RunningMeanStd]) -> None:
        """Rows ``r`` from ``stats[r]``."""
        for r, s in stats.items():
            self.mean[r], self.var[r], self.count[r] = s.mean, s.var, s.count

    def scatter(self, stats: dict[int, RunningMeanStd]) -> None:
        """``stats[r]`` from row ``r``."""
        for r, s in stats.items():
            s.mean, s.var = self.mean[r].copy(), self.var[r].copy()
            s.count = float(self.count[r].item())

    def update(self, x: np.ndarray) -> None:
        """Every row's :meth:`RunningMeanStd.update` with its batch ``x[r]`` (``x [R, n,
        *shape]``)."""
        # one row: its count as a float scalar (the same double arithmetic, less broadcasting)
        count: Any = self.count.item() if self.count.size == 1 else self.count
        self.mean, self.var, total = running_moments(self.mean, self.var, count, x, 1)
        self.count = np.full_like(self.count, total) if self.count.size == 1 else total
