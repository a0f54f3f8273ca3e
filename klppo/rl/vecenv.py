"""klppo's own synchronous vector env, whose state can be checkpointed and restored exactly.

Gymnasium environments cannot, in general, be pickled with their state: MuJoCo and Box2D envs
pickle their constructor arguments only and come back at their initial state without their RNG.
:class:`SameStepVecEnv` therefore keeps, per sub-environment, what made its current episode: how
the episode's reset was seeded (an explicit seed, or the state of the env's ``np_random`` just
before the reset drew from it) and the actions taken since. Restoring makes fresh environments,
resets each the same way and replays its actions (the physics of every env klppo ships a preset
for is deterministic), then checks the replayed observation against the one recorded at capture
time. Wrapper statistics (observation and reward normalisation) live in the trainer and are
restored from the checkpoint, never re-updated by the replay.

Stepping follows Gymnasium's ``SyncVectorEnv`` with ``AutoresetMode.SAME_STEP`` value for value
(same sub-env calls in the same order, observations stored in the space's dtype), so switching to
it changes no trajectory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from klppo.rl.mujoco_steps import fast_step

__all__ = ["SameStepVecEnv", "RestoreReport", "generator_from_state"]

#: the bit generators whose state a checkpoint may hold (a name from a file picks one of these)
BIT_GENERATORS = {c.__name__: c for c in (np.random.PCG64, np.random.PCG64DXSM,
                                          np.random.MT19937, np.random.Philox, np.random.SFC64)}


def generator_from_state(state: Any) -> np.random.Generator:
    """A numpy generator in the saved ``bit_generator.state``; ValueError naming the bad part."""
    name = state.get("bit_generator") if isinstance(state, dict) else None
    if name not in BIT_GENERATORS:
        raise ValueError(f"a saved random generator state names bit generator {name!r}; "
                         f"klppo restores only {sorted(BIT_GENERATORS)}")
    bit_gen = BIT_GENERATORS[name]()
    bit_gen.state = state
    return np.random.Generator(bit_gen)


class RestoreReport(list):
    """Problems found while restoring environment state (empty: the restore is exact)."""


_STANDARD_WRAPPERS = (gym.wrappers.TimeLimit, gym.wrappers.OrderEnforcing,
                      gym.wrappers.PassiveEnvChecker)


def _bare(env: gym.Env) -> tuple[gym.Env, int | None] | None:
    """``(unwrapped env, max_episode_steps)`` when every wrapper around ``env`` is one of
    ``gym.make``'s standard three, else None (the env is then stepped with its wrappers)."""
    limit, e = None, env
    while isinstance(e, gym.Wrapper):
        if not isinstance(e, _STANDARD_WRAPPERS):
            return None
        if isinstance(e, gym.wrappers.TimeLimit):
            limit = e._max_episode_steps
        e = e.env
    return e, limit


def _step_of(env: gym.Env) -> Callable[[Any], tuple[Any, SupportsFloat, bool, bool]]:
    """``env.step`` less its info: :func:`klppo.rl.mujoco_steps.fast_step` where it serves."""
    fast = fast_step(env)
    if fast is not None:
        return fast

    def step(a: Any) -> tuple[Any, SupportsFloat, bool, bool]:
        o, r, term, trunc, _ = env.step(a)
        return o, r, term, trunc
    return step


class SameStepVecEnv:
    """``num_envs`` copies of one Gymnasium env stepped in this process, SAME_STEP autoreset.

    ``step`` returns ``(obs, rewards, terminated, truncated, info)`` like a Gymnasium vector env;
    ``info["final_obs"]`` / ``info["_final_obs"]`` hold the last observation of episodes that
    ended at this step. ``state_dict`` / ``load_state_dict`` capture and restore every
    sub-environment exactly (see the module docstring).
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, make_env: Callable[[], gym.Env], num_envs: int, name: str = "env") -> None:
        self.make_env = make_env
        self.name = name
        self.num_envs = int(num_envs)
        self.envs, self.max_steps = self._make_all()
        self._steps = [_step_of(e) for e in self.envs]
        first = self.envs[0]
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self._elapsed = np.zeros(self.num_envs, np.int64)
        obs_shape = self.single_observation_space.shape
        assert obs_shape is not None, "the observation space has no shape"
        self._obs = np.zeros((self.num_envs, *obs_shape),
                             dtype=self.single_observation_space.dtype)
        self._starts: list[tuple[str, Any]] = [("seed", None)] * self.num_envs
        self._actions: list[list[Any]] = [[] for _ in range(self.num_envs)]

    # ------------------------------------------------------------------ stepping
    def _make_all(self) -> tuple[list[gym.Env], int | None]:
        """Fresh envs, stepped bare when ``gym.make`` only added its standard wrappers (time
        limit, order enforcing, passive checker): the time limit is then counted here, with
        TimeLimit's rule, and the per-step cost of three Python wrappers is saved."""
        envs = [self.make_env() for _ in range(self.num_envs)]
        bare = [_bare(e) for e in envs]
        found = [b for b in bare if b is not None]
        if len(found) == len(bare):
            limits = {b[1] for b in found}
            if len(limits) == 1:
                return [b[0] for b in found], limits.pop()
        return envs, None

    def _step_one(self, i: int, a: Any) -> tuple[Any, SupportsFloat, bool, bool]:
        o, r, term, trunc = self._steps[i](a)
        if self.max_steps is not None:
            self._elapsed[i] += 1
            trunc = trunc or bool(self._elapsed[i] >= self.max_steps)
        return o, r, term, trunc

    def _reset_one(self, i: int, seed: int | None) -> Any:
        env = self.envs[i]
        if seed is None:
            self._starts[i] = ("rng", env.unwrapped.np_random.bit_generator.state)
        else:
            self._starts[i] = ("seed", int(seed))
        self._actions[i] = []
        if self.max_steps is not None:
            self._elapsed[i] = 0
        obs, _ = env.reset(seed=seed)
        return obs

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every sub-environment; ``seed`` seeds sub-env ``i`` with ``seed + i``."""
        for i in range(self.num_envs):
            self._obs[i] = self._reset_one(i, None if seed is None else seed + i)
        return self._obs.copy(), {}

    def step(self, actions: np.ndarray):
        n = self.num_envs
        obs = np.empty_like(self._obs)
        rewards = np.zeros(n, np.float64)
        term = np.zeros(n, np.bool_)
        trunc = np.zeros(n, np.bool_)
        info = self.step_into(actions, obs, rewards, term, trunc)
        return obs, rewards, term, trunc, info

    def step_into(self, actions: np.ndarray, obs: np.ndarray, rewards: np.ndarray,
                  term: np.ndarray, trunc: np.ndarray) -> dict[str, Any]:
        """:meth:`step` writing the observations, rewards and ends into the arrays given (the
        engine's stacked arrays: no allocation per step); returns the info."""
        final_obs = None
        for i in range(self.num_envs):
            a = actions[i]
            self._actions[i].append(a.copy() if isinstance(a, np.ndarray) else a)
            o, rewards[i], term[i], trunc[i] = self._step_one(i, a)
            if term[i] or trunc[i]:
                if final_obs is None:
                    final_obs = np.empty(self.num_envs, dtype=object)
                final_obs[i] = o
                o = self._reset_one(i, None)
            self._obs[i] = o
        obs[...] = self._obs
        if final_obs is None:
            return {}
        return {"final_obs": final_obs, "_final_obs": term | trunc}

    def close(self) -> None:
        for env in self.envs:
            env.close()

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Per sub-environment: how its episode started, the actions since, its observation."""
        return {
            "kind": "replay",
            "env": self.name,
            "episodes": [{"start": self._starts[i], "actions": list(self._actions[i])}
                         for i in range(self.num_envs)],
            "obs": self._obs.copy(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> RestoreReport:
        """Rebuild every sub-environment from fresh and replay its episode; return the problems
        (a replay that ended an episode early or reached another observation)."""
        problems = RestoreReport()
        if state.get("kind") != "replay" or len(state["episodes"]) != self.num_envs:
            problems.append(f"{self.name}: the checkpoint holds no replay state for "
                            f"{self.num_envs} environments")
            return problems
        self.close()
        self.envs, self.max_steps = self._make_all()
        self._steps = [_step_of(e) for e in self.envs]
        for i, ep in enumerate(state["episodes"]):
            problem = self._replay(i, ep["start"], ep["actions"], state["obs"][i])
            if problem:
                problems.append(problem)
        return problems

    def _replay(self, i: int, start: tuple[str, Any], actions: list[Any],
                expected: np.ndarray) -> str | None:
        env = self.envs[i]
        kind, value = start
        if kind == "rng":
            env.unwrapped.np_random = generator_from_state(value)
            value = None
        obs = self._reset_one(i, value)
        for t, a in enumerate(actions):
            self._actions[i].append(a)
            obs, _, term, trunc = self._step_one(i, a)
            if term or trunc:
                return (f"{self.name}: sub-environment {i} ended its episode after {t + 1} of "
                        f"{len(actions)} replayed steps (the environment is not deterministic)")
        self._obs[i] = obs
        if not np.array_equal(self._obs[i], expected):
            diff = float(np.max(np.abs(self._obs[i].astype(np.float64) - expected)))
            return (f"{self.name}: sub-environment {i} replayed to another observation than the "
                    f"checkpoint's (max difference {diff:.3g}; the environment is not "
                    f"deterministic)")
        return None
