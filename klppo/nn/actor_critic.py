"""Actor-critic networks: separate 2x64 tanh MLPs (the KLip-PPO reference) or a shared trunk."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from klppo.nn.distributions import ActionHead, CategoricalHead, DiagGaussianHead

__all__ = ["layer_init", "mlp", "ActorCritic", "make_head"]


def layer_init(layer: nn.Linear, gain: float = math.sqrt(2), bias: float = 0.0) -> nn.Linear:
    """Orthogonal weights with ``gain``, constant bias (the PPO implementation-detail init)."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(in_dim: int, hidden: Sequence[int], out_dim: int | None, out_gain: float) -> nn.Sequential:
    """tanh MLP with orthogonal init: gain sqrt(2) on hidden layers, ``out_gain`` on the last."""
    layers: list[nn.Module] = []
    d = in_dim
    for h in hidden:
        layers += [layer_init(nn.Linear(d, h)), nn.Tanh()]
        d = h
    if out_dim is not None:
        layers.append(layer_init(nn.Linear(d, out_dim), gain=out_gain))
    return nn.Sequential(*layers)


def make_head(action_space) -> ActionHead:
    """The action head for a Gymnasium ``Discrete`` or ``Box`` space."""
    from gymnasium import spaces

    if isinstance(action_space, spaces.Discrete):
        return CategoricalHead(int(action_space.n))
    if isinstance(action_space, spaces.Box):
        return DiagGaussianHead(int(math.prod(action_space.shape)))
    raise ValueError(f"action space must be Discrete or Box, got {action_space!r}")


class ActorCritic(nn.Module):
    """Policy and value networks.

    Args:
        obs_dim: flat observation size.
        head: the action head (:func:`make_head`).
        hidden: hidden layer sizes (default two layers of 64).
        shared_trunk: one trunk feeds both the policy and the value layer.
        separate_losses: with a shared trunk, the value layer reads the trunk's features detached,
            so the trunk gets gradients from the policy loss only.
        log_std_init: initial state-independent log-std for Gaussian policies.
    """

    def __init__(
        self,
        obs_dim: int,
        head: ActionHead,
        hidden: Sequence[int] = (64, 64),
        shared_trunk: bool = False,
        separate_losses: bool = False,
        log_std_init: float = 0.0,
    ) -> None:
        super().__init__()
        self.head = head
        self.shared_trunk = shared_trunk
        self.separate_losses = separate_losses
        self.gaussian = isinstance(head, DiagGaussianHead)
        out = head.dim if isinstance(head, DiagGaussianHead) else head.param_dim
        #: the actor and critic are Linear layers on the trunk, or MLPs when there is none
        self.trunk: nn.Sequential | None
        self.actor: nn.Module
        self.critic: nn.Module
        if shared_trunk:
            self.trunk = mlp(obs_dim, hidden, None, 1.0)
            self.actor = layer_init(nn.Linear(hidden[-1], out), gain=0.01)
            self.critic = layer_init(nn.Linear(hidden[-1], 1), gain=1.0)
        else:
            self.trunk = None
            self.actor = mlp(obs_dim, hidden, out, 0.01)
            self.critic = mlp(obs_dim, hidden, 1, 1.0)
        if isinstance(head, DiagGaussianHead):
            self.log_std = nn.Parameter(torch.full((head.dim,), float(log_std_init)))

    def _params(self, mean_or_logits: torch.Tensor) -> torch.Tensor:
        if not self.gaussian:
            return mean_or_logits
        return torch.cat([mean_or_logits, self.log_std.expand_as(mean_or_logits)], -1)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(distribution parameters [B, P], value [B])``."""
        if self.trunk is not None:
            feats = self.trunk(obs)
            v_in = feats.detach() if self.separate_losses else feats
            return self._params(self.actor(feats)), self.critic(v_in).squeeze(-1)
        return self._params(self.actor(obs)), self.critic(obs).squeeze(-1)

    def policy_params(self, obs: torch.Tensor) -> torch.Tensor:
        if self.trunk is not None:
            return self._params(self.actor(self.trunk(obs)))
        return self._params(self.actor(obs))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        if self.trunk is not None:
            feats = self.trunk(obs)
            return self.critic(feats.detach() if self.separate_losses else feats).squeeze(-1)
        return self.critic(obs).squeeze(-1)
