"""CartPole on gymnasium's numpy vector env: SAME_STEP autoreset (:class:`CartPoleSameStep`),
and the CartPoles of several runs stepped as one array computation (:func:`step_cartpoles`).

A group of CartPole runs makes one env call per run and env step, and the call costs far more
than its physics (about 30 us for 4 envs, most of it Python and a per-call action check). Runs
whose envs share every physical setting step as one: their states side by side ``[4, sum N]``,
gymnasium's Euler update on them once, then each env's own bookkeeping (step counters, its
autoreset from its own generator). Every operation is elementwise in float64 or per env, so
each run's numbers are its env's own, bit for bit (``tests/rl/test_cartpole.py`` steps both
side by side with random actions through resets and truncations).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
from gymnasium.vector import AutoresetMode

from klppo.rl.vecenv import RestoreReport, generator_from_state

__all__ = ["CartPoleSameStep", "physics_key", "step_cartpoles", "step_cartpoles_flat"]

#: the settings of gymnasium's ``CartPoleVectorEnv`` its step reads (the physics, the limits)
_SETTINGS = ("gravity", "masscart", "masspole", "total_mass", "length", "polemass_length",
             "force_mag", "tau", "kinematics_integrator", "theta_threshold_radians",
             "x_threshold", "max_episode_steps", "_sutton_barto_reward")


class CartPoleSameStep(gym.vector.VectorWrapper):
    """Fast path: gymnasium's numpy CartPole vector env with SAME_STEP autoreset.

    ``CartPoleVectorEnv`` (0.7M steps/s for 64 envs) only implements NEXT_STEP autoreset. This
    wrapper resets finished sub-environments in the same step, exactly as the env's own reset
    does (uniform(-0.05, 0.05) state from the env's generator, step counter 0), and reports the
    finished episode's last observation in ``info["final_obs"]``.
    """

    def __init__(self, env: gym.vector.VectorEnv) -> None:
        super().__init__(env)
        self.metadata = {**env.metadata, "autoreset_mode": AutoresetMode.SAME_STEP}

    def step(self, actions):
        return self.same_step(*self.env.step(actions))

    def same_step(self, obs, rew, term, trunc, info):
        """The SAME_STEP autoreset after the vector env's own step: finished sub-environments
        reset now, their last observation in ``info``."""
        done = term | trunc
        if done.any():
            obs = obs.copy()
            info = {**info, **_same_step_reset(self.env.unwrapped, obs, done)}
        return obs, rew, term, trunc, info

    def state_dict(self) -> dict[str, Any]:
        """The numpy vector env's whole dynamic state, as arrays: physics, step counters, the
        autoreset flags and its generator."""
        base: Any = self.env.unwrapped  # gymnasium's CartPoleVectorEnv
        return {"kind": "cartpole", "state": base.state.copy(), "steps": base.steps.copy(),
                "prev_done": base.prev_done.copy(),
                "rng": base.np_random.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> RestoreReport:
        base = self.env.unwrapped
        if state.get("kind") != "cartpole":
            return RestoreReport(["CartPole: the checkpoint holds no CartPole state (one written "
                                  "before klppo stopped unpickling env state is not read)"])
        arrays = {k: np.asarray(state[k]) for k in ("state", "steps", "prev_done")}
        for key, value in arrays.items():
            if value.shape != getattr(base, key).shape:
                return RestoreReport([f"CartPole: the checkpoint's {key} has shape "
                                      f"{value.shape}, the env {getattr(base, key).shape}"])
        for key, value in arrays.items():
            getattr(base, key)[...] = value
        base.np_random = generator_from_state(state["rng"])
        return RestoreReport()


def physics_key(env: Any) -> tuple[Any, ...] | None:
    """What a :class:`CartPoleSameStep`'s step depends on besides its state (None: not one
    whose vector env :func:`step_cartpoles` can step): envs with equal keys step as one."""
    if not isinstance(env, CartPoleSameStep) or env.env is not env.env.unwrapped:
        return None
    base = env.env.unwrapped
    if type(base).step is not CartPoleVectorEnv.step or not all(hasattr(base, k)
                                                                 for k in _SETTINGS):
        return None  # a vector env of its own making: its own step
    return (type(base), *(getattr(base, k) for k in _SETTINGS))


def step_cartpoles(envs: list[CartPoleSameStep], actions: list[np.ndarray]
                   ) -> list[tuple[Any, ...]]:
    """One step of every env of ``envs`` (equal :func:`physics_key`), ``actions[k]`` for
    ``envs[k]``: per env ``(obs, rewards, terminated, truncated, info)`` as its own
    :meth:`CartPoleSameStep.step` returns them (:func:`step_cartpoles_flat`, split per env)."""
    for env, act in zip(envs, actions):
        if np.shape(act) != (env.num_envs,):
            raise ValueError(f"CartPole: actions of shape {np.shape(act)} for {env.num_envs} envs")
    obs, rew, term, trunc, infos = step_cartpoles_flat(envs, np.concatenate(actions))
    out, at = [], 0
    for env, info in zip(envs, infos):
        s = slice(at, at + env.num_envs)
        at = s.stop
        out.append((obs[s], rew[s], term[s], trunc[s], info))
    return out


def step_cartpoles_flat(envs: list[CartPoleSameStep], a: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[dict]]:
    """One step of every env of ``envs`` (equal :func:`physics_key`) with ``a``, their actions
    one env after another: ``(obs, rewards, terminated, truncated)`` of all their sub-envs in
    that order (``[sum N, 4]`` float32, ``[sum N]``) and each env's ``info``, the numbers of each
    env's own :meth:`CartPoleSameStep.step`. Actions that are not 0 or 1 raise before any env
    moves (as the env's own action check does); the engine then steps each env alone, so that a
    run whose actions are bad fails alone."""
    bases: list[Any] = [e.env.unwrapped for e in envs]
    starts, n = [], 0
    for base in bases:
        starts.append(n)
        n += base.num_envs
    if a.shape != (n,):
        raise ValueError(f"CartPole: actions of shape {a.shape} for {n} envs")
    if a.dtype.kind not in "iub" or not ((a == 0) | (a == 1)).all():
        raise ValueError(f"CartPole: actions must be 0 or 1, got {short(a)}")
    state, reward, term, trunc, steps = _physics(bases[0], a, bases)
    slices = [slice(i, i + base.num_envs) for i, base in zip(starts, bases)]
    for base, s in zip(bases, slices):
        base.state, base.steps = state[:, s], steps[s]
    prev = bases[0].prev_done if len(bases) == 1 else \
        np.concatenate([base.prev_done for base in bases])
    if prev.any():  # each env's own NEXT_STEP reset of envs that ended at the last step
        for base, s in zip(bases, slices):
            p = base.prev_done
            if p.any():
                base.state[:, p] = base.np_random.uniform(low=base.low, high=base.high,
                                                          size=(4, p.sum()))
                base.steps[p], reward[s][p], term[s][p], trunc[s][p] = 0, 0.0, False, False
                base.prev_done = np.zeros_like(p)  # (the same step's reset leaves it so)
    obs = state.T.astype(np.float32)
    done = term | trunc
    infos: list[dict] = [{} for _ in bases]
    if done.any():
        ended = [0] if len(bases) == 1 else np.flatnonzero(np.logical_or.reduceat(done, starts))
        for k in ended:
            infos[k] = _same_step_reset(bases[k], obs[slices[k]], done[slices[k]])
    return obs, reward, term, trunc, infos


def _physics(b: Any, a: np.ndarray, bases: list[Any]) -> tuple[np.ndarray, ...]:
    """gymnasium's ``CartPoleVectorEnv.step`` (classic_control/cartpole.py) on the states of
    ``bases`` side by side, with ``b``'s settings: the new ``state [4, sum N]``, rewards,
    terminations, truncations and step counters."""
    x, x_dot, theta, theta_dot = (b.state if len(bases) == 1 else
                                  np.concatenate([e.state for e in bases], 1))
    force = np.sign(a - 0.5) * b.force_mag
    costheta, sintheta = np.cos(theta), np.sin(theta)
    temp = (force + b.polemass_length * np.square(theta_dot) * sintheta) / b.total_mass
    thetaacc = (b.gravity * sintheta - costheta * temp) / (
        b.length * (4.0 / 3.0 - b.masspole * np.square(costheta) / b.total_mass))
    xacc = temp - b.polemass_length * thetaacc * costheta / b.total_mass
    if b.kinematics_integrator == "euler":
        x, x_dot = x + b.tau * x_dot, x_dot + b.tau * xacc
        theta, theta_dot = theta + b.tau * theta_dot, theta_dot + b.tau * thetaacc
    else:  # semi-implicit Euler
        x_dot = x_dot + b.tau * xacc
        x = x + b.tau * x_dot
        theta_dot = theta_dot + b.tau * thetaacc
        theta = theta + b.tau * theta_dot
    state = np.stack((x, x_dot, theta, theta_dot))
    term = ((x < -b.x_threshold) | (x > b.x_threshold) | (theta < -b.theta_threshold_radians)
            | (theta > b.theta_threshold_radians))
    steps = (b.steps if len(bases) == 1 else np.concatenate([e.steps for e in bases])) + \
        np.int32(1)
    trunc = steps >= b.max_episode_steps
    reward = (-np.array(term, dtype=np.float32) if b._sutton_barto_reward
              else np.ones_like(term, dtype=np.float32))
    return state, reward, term, trunc, steps


def _same_step_reset(base: Any, obs: np.ndarray, done: np.ndarray) -> dict[str, Any]:
    """:meth:`CartPoleSameStep.same_step`'s reset of the sub-envs ``done`` of one env, whose
    observations ``obs`` (a view) get their new first states; the env's ``info``."""
    final = np.empty(len(done), dtype=object)
    for i in np.flatnonzero(done):
        final[i] = obs[i].copy()
    base.state[:, done] = base.np_random.uniform(low=base.low, high=base.high,
                                                 size=(4, int(done.sum())))
    base.steps[done] = 0
    base.prev_done[:] = False
    obs[done] = base.state[:, done].T.astype(np.float32)
    return {"final_obs": final, "_final_obs": done.copy()}


def short(a: np.ndarray) -> str:
    bad = a[~((a == 0) | (a == 1))] if a.dtype.kind in "iub" else a
    return f"{bad[:3].tolist()!r} ({a.dtype})"
