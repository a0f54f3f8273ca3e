"""Acting with a policy during rollouts: a general torch runner and a numpy fast path.

A runner turns a ``[N, obs_dim]`` float32 observation array into actions, their
log-probabilities, the distribution parameters and the values, all as numpy arrays. The numpy
runner reads the network's weights through zero-copy views (so optimiser updates are seen at
once) and is used for the common case of separate tanh MLPs (``ActorCritic`` without a shared
trunk): small matrix products in numpy cost about a microsecond where each torch call costs
several. Both draw their randomness from their own seeded generator, whose state is checkpointed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from klppo.nn._rowops import row_cumsum, row_max, row_sum
from klppo.nn.actor_critic import ActorCritic
from klppo.nn.distributions import CategoricalHead

__all__ = ["TorchRunner", "NumpyMLPRunner", "make_runner"]

_HALF_LOG_2PI = np.float32(0.5 * np.log(2 * np.pi))


class TorchRunner:
    """Any ``ActorCritic``: torch forward under inference mode, sampling from a torch.Generator."""

    def __init__(self, agent: ActorCritic, seed: int) -> None:
        self.agent = agent
        self.head = agent.head
        self.device = next(agent.parameters()).device  # the generator samples where it acts
        self.gen = torch.Generator(device=self.device).manual_seed(seed)

    @torch.inference_mode()
    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        params, value = self.agent(torch.from_numpy(obs).to(self.device))
        action = self.head.sample(params, self.gen)
        logp = self.head.log_prob(params, action)
        return tuple(t.cpu().numpy() for t in (action, logp, params, value))

    @torch.inference_mode()
    def value(self, obs: np.ndarray) -> np.ndarray:
        return self.agent.value(torch.from_numpy(obs).to(self.device)).cpu().numpy()

    def state_dict(self) -> dict[str, Any]:
        return {"torch_generator": self.gen.get_state()}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.gen.set_state(s["torch_generator"])


def _mlp_layers(seq: nn.Sequential) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """Zero-copy (W^T, b) views of a Linear/Tanh stack, or None when it is anything else."""
    if not isinstance(seq, nn.Sequential):
        return None
    mods = list(seq)
    layers = []
    for i, m in enumerate(mods):
        if isinstance(m, nn.Linear):
            layers.append((m.weight.detach().numpy().T, m.bias.detach().numpy()))
        elif not isinstance(m, nn.Tanh) or i % 2 == 0:
            return None
    if len(layers) != (len(mods) + 1) // 2 or not isinstance(mods[-1], nn.Linear):
        return None
    return layers


def _forward(layers: list[tuple[np.ndarray, np.ndarray]], x: np.ndarray) -> np.ndarray:
    last = len(layers) - 1
    for k, (wt, b) in enumerate(layers):
        x = np.matmul(x, wt)
        np.add(x, b, out=x)
        if k < last:
            np.tanh(x, out=x)
    return x


class NumpyMLPRunner:
    """Fast path for ``ActorCritic`` with separate tanh MLPs, float32 numpy throughout."""

    def __init__(self, agent: ActorCritic, seed: int) -> None:
        actor, critic = _mlp_layers(agent.actor), _mlp_layers(agent.critic)
        if agent.trunk is not None or actor is None or critic is None:
            raise ValueError("NumpyMLPRunner needs separate Linear/Tanh MLPs")
        self.agent = agent
        self.actor, self.critic = actor, critic
        self.categorical = isinstance(agent.head, CategoricalHead)
        self.log_std = None if self.categorical else agent.log_std.detach().numpy()
        self.rng = np.random.Generator(np.random.PCG64(seed))

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        out = _forward(self.actor, obs)
        value = _forward(self.critic, obs)[:, 0]
        if self.categorical:
            n, k = out.shape
            z = out - row_max(out)
            logp_all = z - np.log(row_sum(np.exp(z)))
            cdf = row_cumsum(np.exp(logp_all))
            u = self.rng.random(n, dtype=np.float32)[:, None] * cdf[:, -1:]
            below = u >= cdf  # inverse-CDF sampling: the action is the count of edges passed
            action = np.zeros(n, np.int64)
            for j in range(k - 1):  # the last edge can only add past k - 1 (cdf is monotone)
                action += below[:, j]
            logp = logp_all[np.arange(n), action]
            return action, logp, out, value
        n, d = out.shape
        log_std = self.log_std  # [d], broadcast over the rows: the same numbers per row
        noise = self.rng.standard_normal(out.shape, dtype=np.float32)
        action = out + np.exp(log_std) * noise
        logp = (-0.5 * noise * noise - log_std - _HALF_LOG_2PI).sum(1)
        params = np.empty((n, 2 * d), np.float32)
        params[:, :d] = out
        params[:, d:] = log_std
        return action, logp, params, value

    def value(self, obs: np.ndarray) -> np.ndarray:
        return _forward(self.critic, obs)[:, 0]

    def state_dict(self) -> dict[str, Any]:
        return {"numpy_rng": self.rng.bit_generator.state}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.rng.bit_generator.state = s["numpy_rng"]


def make_runner(agent: ActorCritic, seed: int, fast: bool = True) -> TorchRunner | NumpyMLPRunner:
    """The numpy fast path when the network allows it (and ``fast``), else the torch runner."""
    if fast:
        try:
            return NumpyMLPRunner(agent, seed)
        except ValueError:
            pass
    return TorchRunner(agent, seed)
