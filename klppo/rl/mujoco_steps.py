"""Gymnasium's Hopper-v4, Walker2d-v4 and HalfCheetah-v4 steps without their per-step Python
overhead, bit for bit.

Gymnasium's ``HopperEnv.step`` (``gymnasium/envs/mujoco/hopper_v4.py``) spends about a fifth of
its time around the physics: ``is_healthy`` is evaluated twice (for the healthy reward and for
the termination), each time concatenating the whole state, and the observation goes through
``np.clip``'s Python wrappers. :func:`fast_step` returns the same step computed once: the same
``mj_step`` and ``mj_rnePostConstraint`` calls, then the reward, the observation and the
termination with the same floating-point operations in the same order (comparisons are exact in
any arrangement, ``min(max(x, -10), 10)`` is ``np.clip``'s), so every number is the env's own
(``tests/rl/test_mujoco_steps.py`` steps both side by side through terminations and resets).
Only gymnasium's own classes without rendering get it; any other env, a subclass included, is
stepped as it is. The per-step ``info`` is not built (klppo's
vector env does not read it).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["fast_step"]

Step = Callable[[Any], tuple[Any, Any, bool, bool]]
Health = Callable[[Any, np.ndarray, np.ndarray], bool]


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


def _walker_healthy(env: Any, qpos: np.ndarray, qvel: np.ndarray) -> bool:
    """``Walker2dEnv.is_healthy``: the height and the angle strictly inside their ranges."""
    (min_z, max_z), (min_angle, max_angle) = env._healthy_z_range, env._healthy_angle_range
    return bool(min_z < qpos[1] < max_z and min_angle < qpos[2] < max_angle)


#: (module, class) -> (its health check, None: no termination; whether it clips the velocity
#: in its observation to [-10, 10])
_SERVED: dict[tuple[str, str], tuple[Health | None, bool]] = {
    ("gymnasium.envs.mujoco.hopper_v4", "HopperEnv"): (_hopper_healthy, True),
    ("gymnasium.envs.mujoco.walker2d_v4", "Walker2dEnv"): (_walker_healthy, True),
    ("gymnasium.envs.mujoco.half_cheetah_v4", "HalfCheetahEnv"): (None, False),
}


def fast_step(env: Any) -> Step | None:
    """``action -> (obs, reward, terminated, truncated)`` computing exactly what the bare
    ``env.step(action)`` returns, for gymnasium's Hopper-v4, Walker2d-v4 and HalfCheetah-v4;
    None for any other env."""
    cls = type(env)
    served = _SERVED.get((cls.__module__, cls.__name__))
    if served is None or getattr(env, "render_mode", None):
        return None
    if cls is not getattr(importlib.import_module(cls.__module__), cls.__name__):
        return None
    health, clip = served
    return lambda action: _forward_step(env, action, health, clip)


def _forward_step(env: Any, action: Any, health: Health | None, clip: bool
                  ) -> tuple[Any, Any, bool, bool]:
    """The v4 step of a planar runner: reward the forward velocity (and staying healthy), less
    the control cost; end when unhealthy (with a health check and ``terminate_when_unhealthy``)."""
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
    terminated = False
    if health is None:
        reward = forward_reward - ctrl_cost
    else:
        healthy = health(env, qpos, qvel)
        healthy_reward = float(healthy or env._terminate_when_unhealthy) * env._healthy_reward
        reward = forward_reward + healthy_reward - ctrl_cost
        terminated = not healthy if env._terminate_when_unhealthy else False
    position = qpos[1:] if env._exclude_current_positions_from_observation else qpos
    velocity = np.minimum(np.maximum(qvel, -10), 10) if clip else qvel
    return np.concatenate((position, velocity)), reward, terminated, False
