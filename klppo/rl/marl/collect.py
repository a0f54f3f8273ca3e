"""Rollouts of several policies over one :class:`~klppo.rl.marl.env.ParallelVecEnv`.

Each policy has a :class:`Slot`: its runner (numpy fast path or torch, own seeded generator),
its ``[T, N_p]`` :class:`~klppo.rl.rollout.RolloutBuffer` (``N_p`` = env copies x its agents),
normalisers and episode returns. Per step every policy acts on its agents' observations, then the
env steps once; what the single-agent :class:`~klppo.rl.rollout.Collector` does per env column
(unclipped actions in the buffer, clipped ones to the env, raw-reward episode returns,
``V(final observation)`` where an episode was truncated) each slot does per agent column.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from klppo.nn.distributions import DiagGaussianHead
from klppo.nn.runners import make_runner
from klppo.rl.marl.env import ParallelVecEnv, StepOut
from klppo.rl.rollout import EpisodeStats, NonFiniteEnvError, RolloutBuffer, bootstrap
from klppo.rl.unit import PolicyUnit

__all__ = ["Slot", "MultiCollector"]


class Slot:
    """One policy's side of a multi-agent rollout."""

    def __init__(self, name: str, unit: PolicyUnit, action_space: Any, T: int, N: int,
                 seed: int) -> None:
        self.name, self.unit, self.T, self.N = name, unit, T, N
        self.runner = make_runner(unit.agent, seed, unit.weights)
        head = unit.agent.head
        self.box = isinstance(head, DiagGaussianHead)
        if self.box:
            self.low = action_space.low.astype(np.float32)
            self.high = action_space.high.astype(np.float32)
        act_shape = tuple(action_space.shape) if self.box else ()
        self.buf = RolloutBuffer.allocate(T, N, unit.obs_dim, act_shape,
                                          np.float32 if self.box else np.int64, head.param_dim)
        self.np = self.buf.numpy()
        self.ep_return = np.zeros(N, np.float64)
        self.next_obs: np.ndarray | None = None
        self.trunc_final: list[tuple[int, int, np.ndarray]] = []

    def prep(self, obs: np.ndarray, update: bool) -> np.ndarray:
        norm = self.unit.obs_norm
        return norm(obs, update) if norm is not None else obs

    def act(self, t: int) -> np.ndarray:
        """Sample this policy's actions at step ``t`` into the buffer; the env's actions."""
        b, obs = self.np, self.next_obs
        assert obs is not None, "reset the collector first"
        action, logp, params, value = self.runner.act(obs)
        b["obs"][t], b["actions"][t], b["logp"][t] = obs, action, logp
        b["params"][t], b["values"][t] = params, value
        return np.minimum(np.maximum(action, self.low), self.high) if self.box else action

    def record(self, t: int, out: StepOut, agents_per_env: int, stats: EpisodeStats) -> None:
        b, p = self.np, self.name
        rew, term, trunc = out.rewards[p], out.terminated[p], out.truncated[p]
        done = np.repeat(out.done, agents_per_env)
        self.ep_return += rew
        for i in np.flatnonzero(done):
            stats.returns.append(float(self.ep_return[i]))
            if trunc[i] and not term[i]:
                self.trunc_final.append((t, int(i), out.final_obs[p][i]))
        self.ep_return[done] = 0.0
        scaler = self.unit.rew_scale
        b["rewards"][t] = scaler(rew, done) if scaler is not None else rew
        b["terminated"][t] = term
        b["truncated"][t] = trunc & ~term
        self.next_obs = self.prep(out.obs[p], update=True)

    def bootstrap(self) -> None:
        """``next_values``: V(s_{t+1}) in the rollout, V(next obs) after it, V(final obs)
        where an episode was truncated."""
        assert self.next_obs is not None, "reset the collector first"
        bootstrap(self.np, self.runner, self.next_obs, self.trunc_final, self.unit.obs_norm)
        self.trunc_final = []

    def state_dict(self) -> dict[str, Any]:
        assert self.next_obs is not None, "reset the collector first"
        return {"next_obs": self.next_obs.copy(), "ep_return": self.ep_return.copy(),
                "runner": self.runner.state_dict()}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        """Restore; ValueError naming the part that does not fit this policy's columns."""
        next_obs = np.array(s["next_obs"], dtype=np.float32)
        ep_return = np.array(s["ep_return"])
        if next_obs.shape != (self.N, self.unit.obs_dim) or ep_return.shape != (self.N,):
            raise ValueError(f"policy {self.name}: next_obs / ep_return have shapes "
                             f"{list(next_obs.shape)} / {list(ep_return.shape)}, its columns "
                             f"[{self.N}, {self.unit.obs_dim}] / [{self.N}]")
        self.next_obs, self.ep_return = next_obs, ep_return
        self.runner.load_state_dict(s["runner"])


class MultiCollector:
    """Steps a :class:`ParallelVecEnv` with one :class:`Slot` per policy."""

    def __init__(self, env: ParallelVecEnv, units: dict[str, PolicyUnit],
                 action_spaces: dict[str, Any], num_steps: int, seed: int) -> None:
        self.env, self.T = env, num_steps
        self.slots = {p: Slot(p, u, action_spaces[p], num_steps, env.columns(p),
                              seed + 1 + 7919 * k) for k, (p, u) in enumerate(units.items())}
        self.ep_length = np.zeros(env.num_envs, np.int64)

    def reset(self) -> None:
        obs = self.env.reset()
        for p, slot in self.slots.items():
            slot.next_obs = slot.prep(obs[p], update=True)

    @staticmethod
    def _check(out: StepOut, iteration: int, t: int) -> None:
        for p in out.obs:
            for what, x in (("observation", out.obs[p]), ("reward", out.rewards[p]),
                            ("observation", out.final_obs[p])):
                if not np.isfinite(x).all():
                    raise NonFiniteEnvError(f"iteration {iteration}, step {t}: the environment "
                                            f"returned a non-finite {what} for policy {p}")

    def collect(self, iteration: int) -> tuple[dict[str, EpisodeStats], list[int]]:
        """One rollout of every policy; per policy the returns of the agent-episodes that
        ended, and the lengths of the episodes that ended."""
        stats = {p: EpisodeStats() for p in self.slots}
        lengths: list[int] = []
        for t in range(self.T):
            actions = {p: slot.act(t) for p, slot in self.slots.items()}
            out = self.env.step(actions)
            self._check(out, iteration, t)
            self.ep_length += 1
            lengths.extend(int(n) for n in self.ep_length[out.done])
            self.ep_length[out.done] = 0
            for p, slot in self.slots.items():
                slot.record(t, out, len(self.env.policies[p]), stats[p])
        for slot in self.slots.values():
            slot.bootstrap()
        return stats, lengths

    def state_dict(self) -> dict[str, Any]:
        return {"ep_length": self.ep_length.copy(),
                "slots": {p: s.state_dict() for p, s in self.slots.items()}}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.ep_length = np.array(s["ep_length"])
        for p, slot in self.slots.items():
            slot.load_state_dict(s["slots"][p])
