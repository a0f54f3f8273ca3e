"""Tiny environments for trainer tests (registered on import)."""

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class Counter(gym.Env):
    """obs = [t], reward 1, truncated at ``limit`` steps; emits NaN from step ``nan_at`` on."""

    def __init__(self, limit: int = 3, nan_at: int | None = None) -> None:
        self.observation_space = spaces.Box(-np.inf, np.inf, (1,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.limit, self.nan_at, self.t, self.total = limit, nan_at, 0, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        self.total += 1
        bad = self.nan_at is not None and self.total >= self.nan_at
        obs = np.array([np.nan if bad else float(self.t)], np.float32)
        return obs, 1.0, False, self.t >= self.limit, {}


gym.register("KlppoTest/Counter-v0", entry_point=Counter)
gym.register("KlppoTest/NaN-v0", entry_point=Counter, kwargs={"limit": 1000, "nan_at": 1500})


class Crash(Counter):
    """Kills its process (as a segfault would) after ``at`` steps."""

    def __init__(self, at: int = 300) -> None:
        super().__init__(limit=50)
        self.at = at

    def step(self, action):
        if self.total + 1 >= self.at:
            import os

            os._exit(3)
        return super().step(action)


gym.register("KlppoTest/Crash-v0", entry_point=Crash)


class Nondeterministic(Counter):
    """Observations from the OS's entropy pool: no replay can reproduce them."""

    def __init__(self) -> None:
        super().__init__(limit=10_000)

    def step(self, action):
        import os

        obs, r, term, trunc, info = super().step(action)
        return obs + np.float32(os.urandom(1)[0]), r, term, trunc, info


gym.register("KlppoTest/Nondeterministic-v0", entry_point=Nondeterministic)


class HugeReward(Counter):
    """Finite rewards so large (1e30 from step ``at`` on) that the critic's loss overflows."""

    def __init__(self, at: int = 1500) -> None:
        super().__init__(limit=50)
        self.at = at

    def step(self, action):
        obs, r, term, trunc, info = super().step(action)
        return obs, (1e30 if self.total >= self.at else r), term, trunc, info


gym.register("KlppoTest/HugeReward-v0", entry_point=HugeReward)


class Spaces(Counter):
    """Counter with other observation and action spaces (klppo refuses those it cannot train)."""

    def __init__(self, obs=None, act=None) -> None:
        super().__init__()
        self.observation_space = obs or self.observation_space
        self.action_space = act or self.action_space


gym.register("KlppoTest/ActionFromOne-v0", entry_point=Spaces,
             kwargs={"act": spaces.Discrete(3, start=1)})
gym.register("KlppoTest/DictObs-v0", entry_point=Spaces,
             kwargs={"obs": spaces.Dict({"x": spaces.Box(-1, 1, (2,))})})
gym.register("KlppoTest/MultiDiscreteAction-v0", entry_point=Spaces,
             kwargs={"act": spaces.MultiDiscrete([2, 3])})


class Unbuildable(Counter):
    """Fails in its constructor (a user's env with a bug)."""

    def __init__(self) -> None:
        raise RuntimeError("cannot open the simulator " + "x" * 1000)


gym.register("KlppoTest/Unbuildable-v0", entry_point=Unbuildable)


class NaNForSeed(Counter):
    """Emits NaN from its 300th step on when reset with seed 1 (and only then): one run of a
    batched group fails while the others, on other seeds, train on."""

    def __init__(self) -> None:
        super().__init__(limit=20)

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.nan_at = 300 if seed == 1 else None
        return super().reset(seed=seed, options=options)


gym.register("KlppoTest/NaNForSeed-v0", entry_point=NaNForSeed)


class NaNForSeedWide(NaNForSeed):
    """:class:`NaNForSeed` observing ``[t, -t, t / 2, 1]`` (four numbers, as CartPole)."""

    def __init__(self) -> None:
        super().__init__()
        self.observation_space = spaces.Box(-np.inf, np.inf, (4,), np.float32)

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        return self._wide(obs), info

    def step(self, action):
        obs, *rest = super().step(action)
        return (self._wide(obs), *rest)

    @staticmethod
    def _wide(obs):
        t = obs[0]
        return np.array([t, -t, t / 2, 1.0], np.float32)


gym.register("KlppoTest/NaNForSeedWide-v0", entry_point=NaNForSeedWide)


def short_counter() -> gym.Env:
    """A factory (no registration): ``klppo train --env tests.rl.envs_for_tests:short_counter``."""
    return Counter(limit=5)


#: an instance: refused as an env (it cannot be made again)
COUNTER_INSTANCE = Counter()
