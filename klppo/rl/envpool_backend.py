"""EnvPool as an env backend (``rollout.env_backend envpool``, ``pip install 'klppo[envpool]'``).

EnvPool steps its environments in C++ (MuJoCo's physics, Gymnasium's reward and termination
rules reimplemented), so a step costs the physics and little else. :class:`EnvPoolSameStep` puts
it behind klppo's vector-env interface: SAME_STEP autoreset (an env that ends at step t is reset
at once; its last observation is in ``info["final_obs"]``), float64 rewards, ``reset(seed=s)``
giving sub-env i the seed ``s + i`` (EnvPool fixes seeds when a pool is made, so a reset with a
new seed makes a new pool).

What differs from Gymnasium's same task (``tests/rl/test_envpool.py`` steps both from the same
physics state with the same action): rewards are float32 in EnvPool (float64 in Gymnasium), so
they agree to float32 rounding; observations agree to about 1e-12 after one step (the physics is
computed in another order), which chaos amplifies over an episode; the episodes' first states
come from EnvPool's own generator, not from numpy's, so the same seed starts other episodes; see
docs/benchmarks.md. EnvPool cannot save or restore an environment's state: a resumed run starts
new episodes and says so (``status.json`` ``warnings``), like ``rollout.vectorization async``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from klppo.rl.vecenv import RestoreReport
from klppo.runs.errors import UserInputError

__all__ = ["EnvPoolSameStep", "check_envpool", "NOT_RESTORABLE"]

NOT_RESTORABLE = ("EnvPool cannot save or restore an environment's state (rollout.env_backend "
                  "envpool): the resumed run starts new episodes and is not identical to an "
                  "uninterrupted one")


def _envpool() -> Any:
    try:
        import envpool
    except ImportError as e:
        raise UserInputError(f"rollout.env_backend='envpool' needs the envpool package: pip "
                             f"install 'klppo[envpool]' ({e})") from None
    return envpool


def check_envpool(env_id: str) -> str:
    """``env_id`` when EnvPool is installed and has that task; one-line error otherwise."""
    envpool = _envpool()
    if env_id not in envpool.list_all_envs():
        raise UserInputError(f"env={env_id!r}: EnvPool has no such task (rollout.env_backend "
                             f"envpool); use rollout.env_backend gymnasium for it")
    return env_id


class EnvPoolSameStep(gym.vector.VectorEnv):
    """An EnvPool pool of ``num_envs`` envs of ``env_id`` with SAME_STEP autoreset (see the
    module docstring)."""

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, env_id: str, num_envs: int, seed: int) -> None:
        self.env_id, self.num_envs = check_envpool(env_id), num_envs
        self.pool = self._make(seed)
        self.single_observation_space = self.pool.observation_space
        self.single_action_space = self.pool.action_space
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space,
                                                              num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self._act_dtype = self.single_action_space.dtype

    def _make(self, seed: int) -> Any:
        self.seed_ = seed
        return _envpool().make(self.env_id, env_type="gymnasium", num_envs=self.num_envs,
                               seed=seed)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Reset every env (a new pool when ``seed`` differs from the pool's)."""
        if seed is not None and seed != self.seed_:
            self.pool.close()
            self.pool = self._make(seed)
        obs, _ = self.pool.reset()
        return obs, {}

    def step(self, actions: np.ndarray):
        obs, rew, term, trunc, _ = self.pool.step(np.asarray(actions, dtype=self._act_dtype))
        done = term | trunc
        info: dict[str, Any] = {}
        if done.any():
            ids = np.flatnonzero(done)
            final = np.empty(self.num_envs, dtype=object)
            for i in ids:
                final[i] = obs[i].copy()
            first, _ = self.pool.reset(ids.astype(np.int32))
            obs = obs.copy()
            obs[ids] = first
            info = {"final_obs": final, "_final_obs": done.copy()}
        return obs, rew.astype(np.float64), term, trunc, info

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint holds of it: its kind (the state itself cannot be read)."""
        return {"kind": "envpool"}

    def load_state_dict(self, state: dict[str, Any]) -> RestoreReport:
        return RestoreReport([f"{self.env_id}: {NOT_RESTORABLE}"])

    def close(self, **kwargs: Any) -> None:
        self.pool.close()
