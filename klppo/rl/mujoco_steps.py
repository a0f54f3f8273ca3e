"""Gymnasium's Hopper-v4 step without its per-step Python overhead, bit for bit.

Gymnasium's ``HopperEnv.step`` (``gymnasium/envs/mujoco/hopper_v4.py``) spends about a third of
its time around the physics: ``is_healthy`` is evaluated twice (for the healthy reward and for
the termination), each time concatenating the whole state, and the observation goes through
``np.clip``'s Python wrappers. :func:`fast_step` returns the same step computed once: the same
``mj_step`` and ``mj_rnePostConstraint`` calls, then the reward, the observation and the
termination with the same floating-point operations in the same order (comparisons are exact in
any arrangement, ``min(max(x, -10), 10)`` is ``np.clip``'s), so every number is the env's own
(``tests/rl/test_mujoco_steps.py`` steps both side by side through terminations and resets).
Only gymnasium's own class with its own ``step`` and no rendering gets it; any other env, or a
subclass that changes the step, is stepped as it is. The per-step ``info`` is not built (klppo's
vector env does not read it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["fast_step"]

#: (module, class) of the envs :func:`fast_step` serves
_HOPPER_V4 = ("gymnasium.envs.mujoco.hopper_v4", "HopperEnv")

Step = Callable[[Any], tuple[Any, Any, bool, bool]]


def fast_step(env: Any) -> Step | None:
    """``action -> (obs, reward, terminated, truncated)`` computing exactly what the bare
    ``env.step(action)`` returns, for gymnasium's Hopper-v4; None for any other env."""
    cls = type(env)
    if (cls.__module__, cls.__name__) != _HOPPER_V4 or getattr(env, "render_mode", None):
        return None
    from gymnasium.envs.mujoco.hopper_v4 import HopperEnv

    if cls is not HopperEnv or cls.step is not HopperEnv.step:
        return None
    return lambda action: _hopper_step(env, action)


def _hopper_step(env: Any, action: Any) -> tuple[Any, Any, bool, bool]:
    import mujoco

    model, data = env.model, env.data
    x_before = data.qpos[0]
    if np.array(action).shape != (model.nu,):  # MujocoEnv.do_simulation's check
        raise ValueError(f"Action dimension mismatch. Expected {(model.nu,)}, found "
                         f"{np.array(action).shape}")
    data.ctrl[:] = action
    mujoco.mj_step(model, data, nstep=env.frame_skip)
    mujoco.mj_rnePostConstraint(model, data)
    qpos, qvel = data.qpos, data.qvel
    x_velocity = (qpos[0] - x_before) / env.dt
    ctrl_cost = env._ctrl_cost_weight * np.sum(np.square(action))
    forward_reward = env._forward_reward_weight * x_velocity
    healthy = _hopper_healthy(env, qpos, qvel)
    healthy_reward = float(healthy or env._terminate_when_unhealthy) * env._healthy_reward
    reward = forward_reward + healthy_reward - ctrl_cost
    position = qpos[1:] if env._exclude_current_positions_from_observation else qpos
    obs = np.concatenate((position, np.minimum(np.maximum(qvel, -10), 10)))
    terminated = not healthy if env._terminate_when_unhealthy else False
    return obs, reward, terminated, False


def _hopper_healthy(env: Any, qpos: np.ndarray, qvel: np.ndarray) -> bool:
    """``HopperEnv.is_healthy``: the state past the first two coordinates, the height and the
    angle strictly inside their ranges."""
    (min_state, max_state), (min_z, max_z) = env._healthy_state_range, env._healthy_z_range
    min_angle, max_angle = env._healthy_angle_range
    z, angle = qpos[1], qpos[2]
    if not (min_z < z < max_z and min_angle < angle < max_angle):
        return False
    for part in (qpos[2:], qvel):
        if not np.logical_and(min_state < part, part < max_state).all():
            return False
    return True
