"""Rollouts of many runs in lock step: one stacked policy forward per env step for all of them.

Each run keeps its own :class:`~klppo.rl.rollout.Collector` (its vector env and seeds, buffer,
observation and reward normalisers, episode bookkeeping) and its own rollout runner's generator.
At step ``t`` the engine stacks the runs' next observations ``[R, N, obs_dim]``, computes every
actor and critic at once (:func:`~klppo.rl.batched.step.stacked_act`), and each run samples from
its own output with its own generator (:meth:`klppo.nn.numpy.NumpyRunner.sample`) and steps its
own env (:meth:`Collector.record`): the numbers of its :meth:`Collector.collect`, bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from klppo.rl.rollout import Collector, EpisodeStats

__all__ = ["collect_all"]


def collect_all(stack: Any, collectors: dict[int, Collector], iterations: dict[int, int],
                obs: dict[str, Any], ops: Any) -> dict[int, EpisodeStats | BaseException]:
    """One rollout of each run (``collectors`` by stack row, each at its iteration); per run its
    episodes, or the error that stopped it (the env's). ``obs`` holds the stacked observation
    buffer between calls (rows of runs not collecting keep old numbers); ``ops`` is the stack's
    step module (:mod:`~klppo.rl.batched.step` or :mod:`~klppo.rl.batched.torch_step`)."""
    first = next(iter(collectors.values()))
    shape = (stack.R, first.N, first.obs_dim)
    X = obs.get("X")
    if X is None or X.shape != shape:
        X = obs["X"] = np.zeros(shape, np.float32)
    out: dict[int, EpisodeStats | BaseException] = {}
    live = dict(collectors)
    for r, c in live.items():
        c.begin()
        X[r] = c.next_obs
    for t in range(first.T):
        actions, values = ops.stacked_act(stack, X)
        for r, c in list(live.items()):
            try:
                c.record(t, *c.runner.sample(actions[r], values[r]), iterations[r])
            except Exception as e:  # noqa: BLE001 - this run's env failed: it alone stops
                out[r] = e
                del live[r]
                continue
            X[r] = c.next_obs
    for r, c in live.items():
        try:
            out[r] = c.finish()
        except Exception as e:  # noqa: BLE001 - its env's final observation (bootstrap)
            out[r] = e
    return out
