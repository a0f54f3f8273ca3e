"""klppo.rl.mujoco_steps.fast_step computes gymnasium's v4 steps bit for bit: both stepped
side by side from the same seed with the same random actions, through terminations and resets,
with the default settings and with every setting the step reads changed."""

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")
pytest.importorskip("mujoco")

from klppo.rl.mujoco_steps import fast_step  # noqa: E402

_CHANGED = {"exclude_current_positions_from_observation": False,
            "forward_reward_weight": 0.7, "ctrl_cost_weight": 0.01}
_HEALTH = {"terminate_when_unhealthy": False, "healthy_reward": 2.5}
SETTINGS = [
    ("Hopper-v4", {}),
    ("Hopper-v4", {**_CHANGED, **_HEALTH}),
    ("Hopper-v4", {"healthy_state_range": (-1.0, 1.0), "healthy_z_range": (1.0, 1.6),
                   "healthy_angle_range": (-0.1, 0.1)}),
    ("Walker2d-v4", {}),
    ("Walker2d-v4", {**_CHANGED, **_HEALTH}),
    ("Walker2d-v4", {"healthy_z_range": (1.0, 1.5), "healthy_angle_range": (-0.3, 0.3)}),
    ("HalfCheetah-v4", {}),
    ("HalfCheetah-v4", _CHANGED),
]


def _bare(env_id="Hopper-v4", **kwargs):
    return gym.make(env_id, **kwargs).unwrapped


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize(("env_id", "kwargs"), SETTINGS)
def test_the_fast_step_is_gymnasiums(env_id, kwargs):
    ref, fast_env = _bare(env_id, **kwargs), _bare(env_id, **kwargs)
    step = fast_step(fast_env)
    assert step is not None
    rng = np.random.default_rng(0)
    ref.reset(seed=3)
    fast_env.reset(seed=3)
    ends = 0
    for t in range(1500):
        a = rng.uniform(-3, 3, ref.model.nu).astype(np.float32)  # beyond the bounds too
        o, r, term, trunc, _ = ref.step(a)
        o2, r2, term2, trunc2 = step(a)
        assert np.array_equal(o, o2) and o.dtype == o2.dtype, t
        assert r == r2 and type(r) is type(r2) and bool(term) is term2 and trunc is trunc2, t
        if term:
            ends += 1
            ref.reset()
            fast_env.reset()
    assert ends >= 5 or not kwargs.get("terminate_when_unhealthy", env_id != "HalfCheetah-v4")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_only_gymnasiums_own_envs_get_it():
    from gymnasium.envs.mujoco.hopper_v4 import HopperEnv

    class Shaped(HopperEnv):
        def step(self, action):
            return super().step(action)

    assert fast_step(_bare(render_mode="rgb_array")) is None
    assert fast_step(Shaped()) is None
    assert fast_step(gym.make("Ant-v4").unwrapped) is None
    assert fast_step(gym.make("Hopper-v5").unwrapped) is None
    with pytest.raises(ValueError, match="Action dimension mismatch"):
        fast_step(_bare())(np.zeros(2, np.float32))
