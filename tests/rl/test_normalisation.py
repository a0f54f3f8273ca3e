"""Observation and reward normalisation against the peers that define the semantics.

klppo normalises inside its own rollout loop (``klppo.rl.envs``) rather than through wrappers;
these tests hold it to Gymnasium's running statistics and to Stable-Baselines3's
``VecNormalize`` (the semantics the MuJoCo presets promise: obs and reward normalisation,
clipped at 10, the discounted return restarted at every episode end), bit for bit.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.wrappers.utils import RunningMeanStd as GymRunningMeanStd

from klppo.rl.envs import ObsNormalizer, RewardScaler, RunningMeanStd


def _stream(rng: np.random.Generator, n: int, shape: tuple[int, ...]) -> list[np.ndarray]:
    """Samples over many orders of magnitude (drifting mean, changing scale)."""
    out = []
    for i in range(n):
        scale = 10.0 ** rng.uniform(-3, 3)
        out.append((rng.standard_normal(shape) * scale + 0.01 * i).astype(np.float32))
    return out


@pytest.mark.parametrize("shape", [(11,), (3, 2), ()])
@pytest.mark.parametrize("batch", [1, 4])
def test_running_statistics_equal_gymnasiums_bit_for_bit(shape, batch):
    rng = np.random.default_rng(0)
    ours, theirs = RunningMeanStd(shape), GymRunningMeanStd(shape=shape)
    for x in _stream(rng, 500, (batch, *shape)):
        ours.update(x)
        theirs.update(x)
        assert np.array_equal(ours.mean, theirs.mean)
        assert np.array_equal(ours.var, theirs.var)
        assert ours.count == theirs.count


class _Scripted(gym.Env):
    """Replays scripted float32 observations, rewards and episode ends (any action)."""

    def __init__(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (5,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.obs = _stream(rng, 400, (5,))
        # float32 values: SB3's DummyVecEnv keeps rewards in float32, klppo in float64
        self.rewards = (rng.standard_normal(400) * 10.0 ** rng.uniform(-2, 2, 400)).astype(
            np.float32).tolist()
        self.ends = rng.random(400) < 0.05
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._next(), {}

    def step(self, action):
        r, end = self.rewards[self.t], bool(self.ends[self.t])
        return self._next(), r, end and self.t % 2 == 0, end and self.t % 2 == 1, {}

    def _next(self) -> np.ndarray:
        self.t += 1
        return self.obs[self.t % 400]


@pytest.mark.parametrize("num_envs", [1, 3])
def test_obs_and_reward_normalisation_equal_sb3_vecnormalize(num_envs):
    vec_env = pytest.importorskip("stable_baselines3.common.vec_env")
    gamma = 0.99
    venv = vec_env.VecNormalize(vec_env.DummyVecEnv([lambda i=i: _Scripted(i)
                                                     for i in range(num_envs)]), gamma=gamma)
    ours = [_Scripted(i) for i in range(num_envs)]
    obs_norm, rew_scale = ObsNormalizer((5,)), RewardScaler(num_envs, gamma)

    expected = venv.reset()
    raw = np.stack([e.reset()[0] for e in ours])
    assert np.array_equal(obs_norm(raw), expected)
    actions = np.zeros((num_envs, 1), np.float32)
    for _ in range(300):
        expected_obs, expected_rew, _, _ = venv.step(actions)
        steps = [e.step(actions[i]) for i, e in enumerate(ours)]
        raw = np.stack([o if not (te or tr) else e.reset()[0]
                        for e, (o, _, te, tr, _) in zip(ours, steps)])
        rew = np.array([s[1] for s in steps], np.float64)
        done = np.array([s[2] or s[3] for s in steps])
        assert np.array_equal(obs_norm(raw), expected_obs)
        assert np.array_equal(rew_scale(rew, done), expected_rew.astype(np.float32))


def test_finite_check_passes_huge_finite_values_and_stops_non_finite():
    from klppo.rl.rollout import Collector, NonFiniteEnvError

    check = Collector._check  # uses no state
    with np.errstate(over="ignore"):  # the quick sum overflows; the exact test decides
        check(None, np.array([[1e308, 1e308]]), np.array([1e308, 1e308]), 1, 0)
    for bad in (np.nan, np.inf, -np.inf):
        with pytest.raises(NonFiniteEnvError, match="iteration 3, step 7: .* observation"):
            check(None, np.array([[1.0, bad]], np.float32), np.array([0.0]), 3, 7)
        with pytest.raises(NonFiniteEnvError, match="reward"):
            check(None, np.array([[1.0, 2.0]]), np.array([bad]), 3, 7)
