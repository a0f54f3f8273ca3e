"""Action distributions as small stateless heads: fast closed forms, checked against torch.

``torch.distributions`` objects validate and allocate on every construction, which dominates the
cost of small-network PPO. A head works on the raw parameter tensor instead (logits, or mean and
log-std) and offers exactly what PPO needs: sample, log_prob, entropy and the analytic
KL(old || new) per state. ``to_torch`` builds the equivalent torch distribution (tests compare the
two; the generic Monte Carlo paths of :mod:`klppo.core` use it).
"""

from __future__ import annotations

import math

import torch
from torch import distributions as D

__all__ = ["CategoricalHead", "DiagGaussianHead", "ActionHead"]

_LOG_2PI = math.log(2 * math.pi)


class CategoricalHead:
    """Discrete actions; ``params`` are logits ``[B, n]``; actions are int64 ``[B]``."""

    def __init__(self, n: int) -> None:
        self.n = int(n)
        self.param_dim = self.n

    def sample(self, params: torch.Tensor, generator: torch.Generator | None = None):
        probs = torch.softmax(params, -1)
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)

    def log_prob(self, params: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(params, -1)
        return logp.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(params, -1)
        return -(logp.exp() * logp).sum(-1)

    def kl(self, params_old: torch.Tensor, params_new: torch.Tensor) -> torch.Tensor:
        """Analytic KL(old || new) per state, nats."""
        lo = torch.log_softmax(params_old, -1)
        ln = torch.log_softmax(params_new, -1)
        return (lo.exp() * (lo - ln)).sum(-1)

    def to_torch(self, params: torch.Tensor) -> D.Distribution:
        return D.Categorical(logits=params)


class DiagGaussianHead:
    """Box actions; ``params`` are ``[B, 2 * dim]``: mean then log-std; actions ``[B, dim]``."""

    def __init__(self, dim: int) -> None:
        self.dim = int(dim)
        self.param_dim = 2 * self.dim

    def split(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return params[..., : self.dim], params[..., self.dim :]

    def sample(self, params: torch.Tensor, generator: torch.Generator | None = None):
        mean, log_std = self.split(params)
        noise = torch.randn(mean.shape, generator=generator, dtype=mean.dtype, device=mean.device)
        return mean + log_std.exp() * noise

    def log_prob(self, params: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        mean, log_std = self.split(params)
        z = (action - mean) * torch.exp(-log_std)
        return (-0.5 * z.square() - log_std - 0.5 * _LOG_2PI).sum(-1)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        _, log_std = self.split(params)
        return (log_std + 0.5 * (1.0 + _LOG_2PI)).sum(-1)

    def kl(self, params_old: torch.Tensor, params_new: torch.Tensor) -> torch.Tensor:
        """Analytic KL(old || new) per state, summed over action dimensions, nats."""
        mo, lso = self.split(params_old)
        mn, lsn = self.split(params_new)
        var_ratio = torch.exp(2 * (lso - lsn))
        t = (mo - mn).square() * torch.exp(-2 * lsn)
        return 0.5 * (var_ratio + t - 1 - 2 * (lso - lsn)).sum(-1)

    def to_torch(self, params: torch.Tensor) -> D.Distribution:
        mean, log_std = self.split(params)
        return D.Independent(D.Normal(mean, log_std.exp()), 1)


ActionHead = CategoricalHead | DiagGaussianHead
