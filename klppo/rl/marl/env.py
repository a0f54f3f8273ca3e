"""Copies of a PettingZoo parallel env stepped in this process, one array per policy.

:class:`ParallelVecEnv` speaks in policies: ``step`` takes one action array per policy and
returns observations, rewards and done flags as one array per policy, whose columns are
``(env copy, agent)`` pairs, env-major. An episode ends when every agent's does (MPE, SISL, the
butterfly envs); an env in which some agents leave earlier than others fails loudly, since a
policy's rollout has no place for an absent agent.

Episodes start from explicit seeds (from the run's seed, the env copy and the episode number),
and the state is what made the current episodes: their seeds and the actions since. Restoring
resets fresh envs with those seeds and replays the actions, then checks the observations against
the recorded ones, exactly like the single-agent :class:`klppo.rl.vecenv.SameStepVecEnv`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from klppo.rl.envs import EnvError
from klppo.rl.vecenv import RestoreReport

__all__ = ["ParallelVecEnv", "StepOut"]


class StepOut:
    """One step's per-policy arrays: ``obs`` (after any reset), ``rewards``, ``terminated``,
    ``truncated``, ``final_obs`` (the observation before the reset, where an episode ended) and
    ``done`` (per env copy)."""

    __slots__ = ("obs", "rewards", "terminated", "truncated", "final_obs", "done")

    def __init__(self, obs, rewards, terminated, truncated, final_obs, done) -> None:
        self.obs, self.rewards, self.terminated = obs, rewards, terminated
        self.truncated, self.final_obs, self.done = truncated, final_obs, done


class ParallelVecEnv:
    def __init__(self, make_env: Callable[[], Any], num_envs: int,
                 policies: dict[str, list[str]], seed: int, name: str = "env") -> None:
        self.make_env, self.num_envs, self.policies = make_env, num_envs, policies
        self.seed, self.name = seed, name
        self.agents = [a for agents in policies.values() for a in agents]
        self.envs = [make_env() for _ in range(num_envs)]
        self._episodes = [0] * num_envs          # episodes started per env copy
        self._starts: list[int | None] = [None] * num_envs
        self._actions: list[list[dict[str, Any]]] = [[] for _ in range(num_envs)]
        self._obs: list[dict[str, np.ndarray]] = [{} for _ in range(num_envs)]

    def columns(self, policy: str) -> int:
        return self.num_envs * len(self.policies[policy])

    # ------------------------------------------------------------------ stepping
    def _episode_seed(self, i: int) -> int:
        ss = np.random.SeedSequence([self.seed, i, self._episodes[i]])
        return int(ss.generate_state(1)[0])

    def _reset_one(self, i: int, seed: int) -> dict[str, np.ndarray]:
        self._starts[i], self._actions[i] = seed, []
        self._episodes[i] += 1
        obs, _ = self.envs[i].reset(seed=seed)
        return obs

    def _gather(self, per_env: list[dict[str, Any]], dtype: Any) -> dict[str, np.ndarray]:
        return {p: np.asarray([per_env[i][a] for i in range(self.num_envs) for a in agents],
                              dtype=dtype) for p, agents in self.policies.items()}

    def reset(self) -> dict[str, np.ndarray]:
        for i in range(self.num_envs):
            self._obs[i] = self._reset_one(i, self._episode_seed(i))
        return self._gather(self._obs, np.float32)

    def _actions_of(self, i: int, actions: dict[str, np.ndarray]) -> dict[str, Any]:
        out = {}
        for p, agents in self.policies.items():
            k = len(agents)
            for j, a in enumerate(agents):
                out[a] = actions[p][i * k + j]
        return out

    def _step_one(self, i: int, act: dict[str, Any]) -> tuple[dict, dict, dict, dict, bool]:
        obs, rew, term, trunc, _ = self.envs[i].step(act)
        ended = {a for a in self.agents if term.get(a, False) or trunc.get(a, False)}
        if ended and len(ended) != len(self.agents):
            raise EnvError(f"{self.name}: agents {sorted(ended)} ended their episode while "
                           f"{sorted(set(self.agents) - ended)} go on; klppo's multi-agent runs "
                           f"need every agent to end together")
        return obs, rew, term, trunc, bool(ended)

    def step(self, actions: dict[str, np.ndarray]) -> StepOut:
        rew, term, trunc, final = [], [], [], list(self._obs)
        done = np.zeros(self.num_envs, np.bool_)
        for i in range(self.num_envs):
            act = self._actions_of(i, actions)
            self._actions[i].append({a: np.array(v, copy=True) for a, v in act.items()})
            obs, r, te, tr, done[i] = self._step_one(i, act)
            rew.append(r)
            term.append(te)
            trunc.append(tr)
            final[i] = obs
            self._obs[i] = self._reset_one(i, self._episode_seed(i)) if done[i] else obs
        return StepOut(self._gather(self._obs, np.float32), self._gather(rew, np.float64),
                       self._gather(term, np.bool_), self._gather(trunc, np.bool_),
                       self._gather(final, np.float32), done)

    def close(self) -> None:
        for env in self.envs:
            env.close()

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Per env copy: the seed of its episode, the actions since and its observations."""
        return {"kind": "pettingzoo-replay", "env": self.name,
                "episodes": [{"number": self._episodes[i], "seed": self._starts[i],
                              "actions": list(self._actions[i]), "obs": dict(self._obs[i])}
                             for i in range(self.num_envs)]}

    def load_state_dict(self, state: dict[str, Any]) -> RestoreReport:
        """Fresh envs, each reset with its episode's seed and its actions replayed; the problems
        (an episode that ended early, another observation) are returned, never raised."""
        problems = RestoreReport()
        eps = state.get("episodes", [])
        if state.get("kind") != "pettingzoo-replay" or len(eps) != self.num_envs:
            problems.append(f"{self.name}: the checkpoint holds no replay state for "
                            f"{self.num_envs} environments")
            return problems
        self.close()
        self.envs = [self.make_env() for _ in range(self.num_envs)]
        for i, ep in enumerate(eps):
            problem = self._replay(i, ep)
            if problem:
                problems.append(problem)
        return problems

    def _replay(self, i: int, ep: dict[str, Any]) -> str | None:
        obs = self._reset_one(i, ep["seed"])
        self._episodes[i] = ep["number"]
        for t, act in enumerate(ep["actions"]):
            self._actions[i].append(act)
            obs, _, _, _, done = self._step_one(i, act)
            if done:
                return (f"{self.name}: env {i} ended its episode after {t + 1} of "
                        f"{len(ep['actions'])} replayed steps (the environment is not "
                        f"deterministic)")
        self._obs[i] = obs
        for a, expected in ep["obs"].items():
            if not np.array_equal(np.asarray(obs[a]), np.asarray(expected)):
                return (f"{self.name}: env {i} replayed to another observation of {a} than the "
                        f"checkpoint's (the environment is not deterministic)")
        return None
