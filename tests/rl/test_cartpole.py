"""CartPoles of several runs stepped as one (klppo.rl.cartpole.step_cartpoles) equal each env
stepped alone by gymnasium, bit for bit: observations, rewards, ends, the finished episodes'
last observations, and the env's whole state (physics, counters, generator) after every step,
through terminations, truncations and resets."""

import gymnasium as gym
import numpy as np
import pytest

from klppo.rl.cartpole import CartPoleSameStep, physics_key, step_cartpoles


def cartpole(n, seed, **kwargs):
    env = CartPoleSameStep(gym.make_vec("CartPole-v1", n, vectorization_mode="vector_entry_point",
                                        **kwargs))
    env.reset(seed=seed)
    return env


def same(a, b):
    if isinstance(a, dict):
        assert sorted(a) == sorted(b)
        for k in a:
            same(a[k], b[k])
    elif isinstance(a, np.ndarray) and a.dtype == object:
        assert [x is None for x in a] == [x is None for x in b]
        for x, y in zip(a, b):
            if x is not None:
                same(x, y)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    else:
        assert a == b


@pytest.mark.parametrize("kwargs", [{}, {"max_episode_steps": 15}, {"sutton_barto_reward": True}])
@pytest.mark.parametrize("sizes, seeds", [((4, 1, 5), (0, 7, 3)), ((4,), (2,))])
def test_cartpoles_stepped_as_one_equal_each_alone(kwargs, sizes, seeds):
    grouped = [cartpole(n, s, **kwargs) for n, s in zip(sizes, seeds)]
    alone = [cartpole(n, s, **kwargs) for n, s in zip(sizes, seeds)]
    assert len({physics_key(e) for e in grouped}) == 1
    rng = np.random.default_rng(0)
    ends = 0
    for t in range(400):
        bias = 0.9 if (t // 25) % 2 else 0.5  # runs of one push to end episodes early
        actions = [(rng.random(n) < bias).astype(np.int64) for n in sizes]
        got = step_cartpoles(grouped, actions)
        for env, a, g in zip(alone, actions, got):
            want = env.step(a)
            for x, y in zip(g, want):
                same(x, y)
            ends += int(want[2].sum() + want[3].sum())
        for e, f in zip(grouped, alone):
            same(e.state_dict(), f.state_dict())
    assert ends > 20


def test_other_physics_or_a_wrapper_do_not_step_together():
    a, b = cartpole(2, 0), cartpole(2, 1, max_episode_steps=50)
    assert physics_key(a) != physics_key(b)
    assert physics_key(gym.make_vec("CartPole-v1", 2, vectorization_mode="sync")) is None
    from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv

    class Windy(CartPoleVectorEnv):  # a vector env of the user's own making: its own step
        def step(self, action):
            return super().step(action)

    windy = CartPoleSameStep(Windy(num_envs=2))
    windy.reset(seed=0)
    assert physics_key(windy) is None


def test_bad_actions_are_refused_before_any_env_moves():
    envs = [cartpole(2, 0), cartpole(2, 1)]
    before = [e.state_dict() for e in envs]
    for bad in ([np.array([0, 2]), np.array([1, 0])], [np.array([0.5, 1.0]), np.array([1, 0])],
                [np.array([0, 1, 1]), np.array([1, 0])]):
        with pytest.raises(ValueError, match="CartPole: actions"):
            step_cartpoles(envs, bad)
    for e, s in zip(envs, before):
        same(e.state_dict(), s)
