"""One run's rollout state: its preallocated buffers, episode statistics and bootstrapping.

The engine collects every single-agent run through its :class:`Collector` in lock step with the
other runs of its stack (:mod:`klppo.rl.engine.collect`); the collector holds what the run's
checkpoint keeps of its collection (next observation, episode counters, runner generator)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from klppo.nn.actor_critic import ActorCritic
from klppo.nn.distributions import DiagGaussianHead
from klppo.nn.numpy.weights import FlatWeights
from klppo.nn.runners import make_runner
from klppo.rl.envs import ObsNormalizer, RewardScaler

__all__ = ["NonFiniteEnvError", "RolloutBuffer", "BUFFER_FIELDS", "stacked_of", "Collector",
           "EpisodeStats", "bootstrap", "bootstrap_truncated"]


def bootstrap(b: dict[str, np.ndarray], runner: Any, next_obs: np.ndarray,
              trunc_final: list[tuple[int, int, np.ndarray]], obs_norm: Any) -> None:
    """Fill ``b["next_values"]`` ([T, N]): V(s_{t+1}) inside the rollout, V(next obs) after
    it, and V(final observation) at the steps ``(t, i, final_obs)`` where an episode was
    truncated (normalised as the policy saw its other observations). Single- and multi-agent
    collection share it."""
    b["next_values"][:-1] = b["values"][1:]
    b["next_values"][-1] = runner.value(next_obs)
    bootstrap_truncated(b, runner, trunc_final, obs_norm)


def bootstrap_truncated(b: dict[str, np.ndarray], runner: Any,
                        trunc_final: list[tuple[int, int, np.ndarray]], obs_norm: Any) -> None:
    """``b["next_values"][t, i]`` = V(final observation, normalised as the policy saw its
    other observations) at the steps ``(t, i, final_obs)`` where an episode was truncated."""
    if trunc_final:
        finals = np.stack([f for _, _, f in trunc_final])
        if obs_norm is not None:
            finals = obs_norm.normalize(finals)
        v = runner.value(finals)
        for k, (t, i, _) in enumerate(trunc_final):
            b["next_values"][t, i] = v[k]


class NonFiniteEnvError(RuntimeError):
    """The environment returned NaN or infinite observations or rewards."""


@dataclass
class RolloutBuffer:
    """``[T, N, ...]`` tensors of one rollout, allocated once (``[R, T, N, ...]``: the rollouts
    of a stack's R runs, the lock-step collection's). Each tensor shares memory with a numpy
    array that the collector writes step by step; ``advantages`` and ``returns`` are GAE's,
    written after the rollout (:func:`klppo.rl.engine.advantages.group_gae`). A run's buffer
    in a stack is a row of the stack's (``stacked``: that buffer and the row)."""

    obs: torch.Tensor
    actions: torch.Tensor
    logp: torch.Tensor
    params: torch.Tensor
    values: torch.Tensor
    next_values: torch.Tensor
    rewards: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    stacked: tuple[RolloutBuffer, int] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def allocate(cls, T: int, N: int, obs_dim: int, act_shape: tuple[int, ...], act_dtype,
                 param_dim: int) -> RolloutBuffer:
        f = np.float32
        z = lambda *shape, dtype=f: torch.from_numpy(np.zeros(shape, dtype))  # noqa: E731
        return cls(
            obs=z(T, N, obs_dim),
            actions=z(T, N, *act_shape, dtype=act_dtype),
            logp=z(T, N),
            params=z(T, N, param_dim),
            values=z(T, N),
            next_values=z(T, N),
            rewards=z(T, N),
            terminated=z(T, N, dtype=np.bool_),
            truncated=z(T, N, dtype=np.bool_),
            advantages=z(T, N),
            returns=z(T, N),
        )

    @classmethod
    def of(cls, arrays: dict[str, np.ndarray],
           stacked: tuple[RolloutBuffer, int] | None = None) -> RolloutBuffer:
        """The buffer whose tensors share memory with ``arrays`` (one per field)."""
        t = {k: torch.from_numpy(arrays[k]) for k in BUFFER_FIELDS}
        return cls(t["obs"], t["actions"], t["logp"], t["params"], t["values"],
                   t["next_values"], t["rewards"], t["terminated"], t["truncated"],
                   t["advantages"], t["returns"], stacked)

    def numpy(self) -> dict[str, np.ndarray]:
        """Zero-copy numpy views of every array."""
        return {k: getattr(self, k).numpy() for k in BUFFER_FIELDS}


#: the arrays of a :class:`RolloutBuffer`
BUFFER_FIELDS = tuple(k for k in RolloutBuffer.__dataclass_fields__ if k != "stacked")


def stacked_of(bufs: list[RolloutBuffer]) -> RolloutBuffer | None:
    """The stacked buffer every one of ``bufs`` is a row of, or None."""
    first = bufs[0].stacked
    if first is None or any(b.stacked is None or b.stacked[0] is not first[0] for b in bufs):
        return None
    return first[0]


@dataclass
class EpisodeStats:
    """Returns and lengths of the training episodes that ended during one rollout (raw rewards,
    before any normalisation)."""

    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)


class Collector:
    """One run's side of collection from a SAME_STEP-autoreset vector env (see the module
    docstring).

    Actions come from a runner (:mod:`klppo.nn.runners`) with its own seeded generator
    (checkpointed): the numpy runner on ``weights``, its numpy stack row, else the torch
    runner. Box actions are clipped to ``act_low`` / ``act_high`` for the env while the buffer
    keeps the unclipped action and its log-probability. Truncated steps store ``V(final
    observation)`` in ``next_values``.
    """

    def __init__(self, env: gym.vector.VectorEnv, agent: ActorCritic, num_steps: int, seed: int,
                 obs_norm: ObsNormalizer | None, reward_scaler: RewardScaler | None,
                 weights: FlatWeights | None = None) -> None:
        self.env = env
        self.agent = agent
        self.head = agent.head
        self.T, self.N = num_steps, env.num_envs
        self.runner = make_runner(agent, seed, weights)
        self.obs_norm = obs_norm
        self.reward_scaler = reward_scaler
        obs_space: Any = env.single_observation_space  # a Box (checked when the env was made)
        self.obs_dim = int(np.prod(obs_space.shape))
        act_space: Any = env.single_action_space  # Discrete or Box
        self.box = isinstance(self.head, DiagGaussianHead)
        if self.box:
            self.act_low = act_space.low.astype(np.float32)
            self.act_high = act_space.high.astype(np.float32)
        act_shape = tuple(act_space.shape) if self.box else ()
        act_dtype = np.float32 if self.box else np.int64
        self.buf = RolloutBuffer.allocate(self.T, self.N, self.obs_dim, act_shape, act_dtype,
                                          self.head.param_dim)
        self.np = self.buf.numpy()
        self.ep_return = np.zeros(self.N, np.float64)
        self.ep_length = np.zeros(self.N, np.int64)
        self.next_obs: np.ndarray | None = None
        self.stats = EpisodeStats()
        #: the steps ``(t, env, final obs)`` of this rollout where an episode was truncated
        self.trunc_final: list[tuple[int, int, np.ndarray]] = []

    def reset(self, seed: int) -> None:
        obs, _ = self.env.reset(seed=seed)
        self.next_obs = self._prep_obs(obs, update=True)

    def _prep_obs(self, obs: np.ndarray, update: bool) -> np.ndarray:
        obs = np.asarray(obs, dtype=np.float32).reshape(self.N if obs.ndim > 1 else -1, -1)
        return self.obs_norm(obs, update) if self.obs_norm is not None else obs

    def _check(self, obs: np.ndarray, rew: np.ndarray, iteration: int, t: int) -> None:
        # one sum is finite when every term is; the exact test runs only when it is not (a sum
        # of huge finite values overflows, with numpy's overflow warning, and passes it)
        if math.isfinite(np.add.reduce(obs, axis=None)) and \
                math.isfinite(np.add.reduce(rew, axis=None)):
            return
        if not np.isfinite(obs).all():
            raise NonFiniteEnvError(f"iteration {iteration}, step {t}: the environment returned "
                                    f"a non-finite observation")
        if not np.isfinite(rew).all():
            raise NonFiniteEnvError(f"iteration {iteration}, step {t}: the environment returned "
                                    f"a non-finite reward")

    def begin(self) -> None:
        """Start a rollout (the engine collects it: :mod:`klppo.rl.engine.collect`)."""
        self.stats, self.trunc_final = EpisodeStats(), []

    def bootstrap_truncated(self) -> None:
        """V(final observation) where an episode of the rollout was truncated (the engine
        bootstraps the rest for all its runs at once)."""
        bootstrap_truncated(self.np, self.runner, self.trunc_final, self.obs_norm)

    def use_buffers(self, arrays: dict[str, np.ndarray],
                    stacked: tuple[RolloutBuffer, int] | None = None) -> None:
        """Collect into ``arrays`` (one ``[T, N, ...]`` array per buffer field) from now on:
        row ``stacked[1]`` of the stacked buffer ``stacked[0]`` (its arrays' rows), if given."""
        self.np = arrays
        self.buf = RolloutBuffer.of(arrays, stacked)

    def state_dict(self) -> dict[str, Any]:
        assert self.next_obs is not None  # (set by reset)
        return {"next_obs": self.next_obs.copy(), "ep_return": self.ep_return.copy(),
                "ep_length": self.ep_length.copy(), "runner": self.runner.state_dict()}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        """Restore; ValueError naming the part whose shape or values do not fit the run (a
        forged or damaged checkpoint is refused here, not iterations later)."""
        next_obs = np.array(s["next_obs"], dtype=np.float32)
        ep_return, ep_length = np.array(s["ep_return"]), np.array(s["ep_length"])
        if next_obs.shape != (self.N, self.obs_dim):
            raise ValueError(f"collector.next_obs has shape {list(next_obs.shape)}, the run's "
                             f"envs give [{self.N}, {self.obs_dim}]")
        if ep_return.shape != (self.N,) or ep_length.shape != (self.N,) or \
                not np.issubdtype(ep_length.dtype, np.integer) or (ep_length < 0).any():
            raise ValueError(f"collector.ep_return / ep_length: shapes {list(ep_return.shape)} / "
                             f"{list(ep_length.shape)}, must be [{self.N}] (lengths whole "
                             f"and >= 0)")
        self.next_obs, self.ep_return, self.ep_length = next_obs, ep_return, ep_length
        self.runner.load_state_dict(s["runner"])
