"""EnvPool as an env backend (``rollout.env_backend envpool``, the envpool extra).

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
from klppo.runs.install import install_hint

__all__ = ["EnvPoolSameStep", "EnvPoolGroup", "EnvPoolSlice", "check_envpool", "NOT_RESTORABLE"]

NOT_RESTORABLE = ("EnvPool cannot save or restore an environment's state (rollout.env_backend "
                  "envpool): the resumed run starts new episodes and is not identical to an "
                  "uninterrupted one")


def _envpool() -> Any:
    try:
        import envpool
    except ImportError as e:
        raise UserInputError(f"rollout.env_backend='envpool' needs the envpool package: "
                             f"{install_hint('envpool')} ({e})") from None
    return envpool


def check_envpool(env_id: str) -> str:
    """``env_id`` when EnvPool is installed and has that task; one-line error otherwise."""
    envpool = _envpool()
    if env_id not in envpool.list_all_envs():
        raise UserInputError(f"env={env_id!r}: EnvPool has no such task (rollout.env_backend "
                             f"envpool); use rollout.env_backend gymnasium for it")
    return env_id


def same_step(pool: Any, actions: np.ndarray) -> tuple[Any, ...]:
    """One step of every env of an EnvPool ``pool`` with SAME_STEP autoreset: an env that ends
    is reset at once, its last observation in ``info["final_obs"]``; rewards as float64."""
    obs, rew, term, trunc, _ = pool.step(actions)
    done = term | trunc
    info: dict[str, Any] = {}
    if done.any():
        ids = np.flatnonzero(done)
        final = np.empty(len(done), dtype=object)
        for i in ids:
            final[i] = obs[i].copy()
        first, _ = pool.reset(ids.astype(np.int32))
        obs = obs.copy()
        obs[ids] = first
        info = {"final_obs": final, "_final_obs": done.copy()}
    return obs, rew.astype(np.float64), term, trunc, info


class EnvPoolSameStep(gym.vector.VectorEnv):
    """An EnvPool pool of ``num_envs`` envs of ``env_id`` with SAME_STEP autoreset (see the
    module docstring)."""

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, env_id: str, num_envs: int, seed: int) -> None:
        self.env_id, self.num_envs = check_envpool(env_id), num_envs
        self.stepped = True  # until a reset
        self.pool = self._make(seed)
        self.single_observation_space = self.pool.observation_space
        self.single_action_space = self.pool.action_space
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space,
                                                              num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self._act_dtype = self.single_action_space.dtype

    def _make(self, seed: int) -> Any:
        self.seed_, self.resets = seed, 0
        return _envpool().make(self.env_id, env_type="gymnasium", num_envs=self.num_envs,
                               seed=seed)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Reset every env (a new pool when ``seed`` differs from the pool's)."""
        if seed is not None and seed != self.seed_:
            self.pool.close()
            self.pool = self._make(seed)
        obs, _ = self.pool.reset()
        self.resets += 1  # since the pool was made, and not stepped since: a group may adopt
        self.stepped = False  # its envs at this state (EnvPoolGroup)
        return obs, {}

    def step(self, actions: np.ndarray):
        self.stepped = True
        return same_step(self.pool, np.asarray(actions, dtype=self._act_dtype))

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint holds of it: its kind (the state itself cannot be read)."""
        return {"kind": "envpool"}

    def load_state_dict(self, state: dict[str, Any]) -> RestoreReport:
        return RestoreReport([f"{self.env_id}: {NOT_RESTORABLE}"])

    def close(self, **kwargs: Any) -> None:
        self.pool.close()


class EnvPoolGroup:
    """ONE EnvPool pool for the envs of several runs (an engine group's, one row each), so that
    one call steps them all and EnvPool's ``num_threads`` threads share the physics.

    Run k's ``n_k`` envs are seeded ``seed_k + i`` as its own pool would seed them (EnvPool takes
    a seed per env), so every run steps the episodes of its own pool, bit for bit
    (``tests/rl/test_envpool.py``). Each run's vector env is a :class:`EnvPoolSlice`; the
    engine steps the slices of a group together with :meth:`step`. :meth:`adopt` builds one
    from freshly reset :class:`EnvPoolSameStep` envs, or returns None."""

    def __init__(self, env_id: str, seeds: list[int], sizes: list[int], threads: int,
                 resets: list[int] | None = None) -> None:
        self.env_id, self.sizes = check_envpool(env_id), sizes
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        env_seed = [s + i for s, n in zip(seeds, sizes) for i in range(n)]
        self.pool = _envpool().make(env_id, env_type="gymnasium", num_envs=len(env_seed),
                                    seed=env_seed, num_threads=threads)
        self.first_obs, _ = self.pool.reset()
        for k, n in enumerate(resets or []):  # each run's envs at their own pool's episodes
            for _ in range(n - 1):
                self.first_obs[self.ids(k)], _ = self.pool.reset(self.ids(k))
        space = self.pool.action_space
        self._actions = np.zeros((len(env_seed), *space.shape), space.dtype)
        self.slices = [EnvPoolSlice(self, k, s) for k, s in enumerate(seeds)]
        self.open = len(seeds)

    @classmethod
    def adopt(cls, envs: list[Any], threads: int) -> EnvPoolGroup | None:
        """A pool for ``envs`` (EnvPool envs of one task, each reset and not stepped since);
        None when there are fewer than two or they differ. The old pools are closed."""
        if len(envs) < 2 or not all(isinstance(e, EnvPoolSameStep) and not e.stepped
                                    for e in envs):
            return None
        if len({e.env_id for e in envs}) != 1:
            return None
        group = cls(envs[0].env_id, [e.seed_ for e in envs], [e.num_envs for e in envs], threads,
                    [e.resets for e in envs])
        for e in envs:
            e.close()
        return group

    def step(self, actions: dict[int, np.ndarray]) -> dict[int, tuple[Any, ...]]:
        """Step every env of the pool: slice k's envs with ``actions[k]`` (a slice not given
        steps with zero actions: its run has stopped); per given slice its ``(obs, rewards,
        terminated, truncated, info)`` as :class:`EnvPoolSameStep` returns them."""
        for k, a in actions.items():
            self._actions[self.offsets[k]:self.offsets[k + 1]] = a
        obs, rew, term, trunc, info = same_step(self.pool, self._actions)
        out = {}
        for k in actions:
            s, e = self.offsets[k], self.offsets[k + 1]
            mine: dict[str, Any] = {}
            if info and info["_final_obs"][s:e].any():
                mine = {"final_obs": info["final_obs"][s:e], "_final_obs": info["_final_obs"][s:e]}
            out[k] = (obs[s:e], rew[s:e], term[s:e], trunc[s:e], mine)
        return out

    def ids(self, k: int) -> np.ndarray:
        """Slice k's env ids in the pool."""
        return np.arange(self.offsets[k], self.offsets[k + 1], dtype=np.int32)

    def release(self) -> None:
        """One slice closed; the pool closes with the last."""
        self.open -= 1
        if self.open == 0:
            self.pool.close()


class EnvPoolSlice(gym.vector.VectorEnv):
    """Run k's envs in an :class:`EnvPoolGroup`: its engine group steps them
    (:meth:`EnvPoolGroup.step`). A reset with another seed (a resume that starts new episodes)
    moves the run to a pool of its own, an :class:`EnvPoolSameStep`."""

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, group: EnvPoolGroup, k: int, seed: int) -> None:
        self.group, self.k, self.seed_ = group, k, seed
        self.num_envs = group.sizes[k]
        self.single_observation_space = group.pool.observation_space
        self.single_action_space = group.pool.action_space
        self.own: EnvPoolSameStep | None = None
        self.closed = False

    @property
    def pooled(self) -> bool:
        """Stepped by its group (not by a pool of its own)."""
        return self.own is None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if self.own is None and (seed is None or seed == self.seed_):
            obs, _ = self.group.pool.reset(self.group.ids(self.k))
            return obs, {}
        if self.own is None:
            assert seed is not None  # (a reset without a seed stays in the pool)
            self.own = EnvPoolSameStep(self.group.env_id, self.num_envs, int(seed))
        return self.own.reset(seed=seed)

    def step(self, actions: np.ndarray):
        if self.own is None:
            raise RuntimeError("an env of a group's EnvPool pool steps with its group "
                               "(EnvPoolGroup.step)")
        return self.own.step(actions)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "envpool"}

    def load_state_dict(self, state: dict[str, Any]) -> RestoreReport:
        return RestoreReport([f"{self.group.env_id}: {NOT_RESTORABLE}"])

    def close(self, **kwargs: Any) -> None:
        if self.own is not None:
            self.own.close()
        if not self.closed:
            self.closed = True
            self.group.release()
