"""The step-backend contract: what one PPO minibatch step returns, and what every backend shares.

A step backend applies one PPO minibatch step: ``begin(batch, advantages)`` once per update,
then ``step(idx, beta) -> StepResult`` per minibatch, ``policy_kl(batch)`` after the update.
Two implement it: :class:`klppo.rl.backends.TorchStep` (autograd, any network) and
:class:`klppo.nn.numpy.NumpyStep` (the numpy fast path). ``batch`` is a
:class:`klppo.rl.update.Batch` (read by attribute: ``obs``, ``actions``, ``logp``, ``params``,
``values``, ``returns``, torch tensors ``[B, ...]``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from klppo.core.kl import k3

__all__ = ["StepResult", "StepBackend"]


@dataclass
class StepResult:
    """One step's detached per-sample outputs (tensors or numpy arrays ``[n]``), its loss terms
    (0-d tensors or floats), the pre-clip gradient norm and ``samples``: the per-sample
    quantities the loss computed on the way (:data:`klppo.core.loss.PER_SAMPLE`), so the
    diagnostics read them instead of evaluating the objective again."""

    idx: Any
    logp: Any
    values: Any
    entropy: Any
    kl: Any
    adv: Any
    grad_norm: Any
    terms: dict[str, Any]
    samples: dict[str, Any] = field(default_factory=dict)

    @property
    def controller_kl(self) -> Any:
        """KL(old || new) for a minibatch/epoch-cadence controller, nats per sample: the KL the
        penalty used (analytic or sampled), else the mean analytic KL."""
        if "kl_penalty" in self.terms:
            return self.terms["kl_penalty"]
        return self.kl.mean() if isinstance(self.kl, torch.Tensor) else float(np.mean(self.kl))

    @property
    def mean_kl(self) -> float:
        """Mean analytic KL(old || new) of the step's forward pass (before its update), nats per
        sample: what an lr or clip actuator with after-step timing is fed."""
        return float(self.kl.mean()) if isinstance(self.kl, torch.Tensor) else \
            float(np.mean(self.kl))


class StepBackend:
    """What both backends share: the optimiser's lr and state, and the k3 early-stop check
    (``agent``, ``optimizer``, ``batch`` and ``device`` are set by the subclasses)."""

    fast: bool = False
    agent: Any
    optimizer: Any
    batch: Any
    device: torch.device

    def k3(self, idx: torch.Tensor) -> float:
        """Sampled k3 KL(old || current) on a minibatch (nats per sample), before stepping on it:
        the mean of :func:`klppo.core.kl.k3` at ``log r = logp_current - logp_old``."""
        b, idx = self.batch, idx.to(self.device)
        with torch.no_grad():
            params = self.agent.policy_params(b.obs[idx])
            return float(k3(self.agent.head.log_prob(params, b.actions[idx]) - b.logp[idx]).mean())

    def analytic_kl(self, idx: torch.Tensor) -> float:
        """Mean analytic KL(old || current) over the minibatch rows ``idx`` (per state, summed
        over action dimensions; nats per sample), before stepping on them: what an lr or clip
        actuator with before-step timing (rsl_rl's) is fed."""
        b, idx = self.batch, idx.to(self.device)
        with torch.no_grad():
            params = self.agent.policy_params(b.obs[idx])
            return float(self.agent.head.kl(b.params[idx], params).mean())

    def ratio(self, idx: torch.Tensor) -> torch.Tensor:
        """Per-sample ratio ``w = pi_current(a|s) / pi_old(a|s)`` on the minibatch rows ``idx``,
        before stepping on them (``[n]``, on the CPU): what a clip-bound controller (BAPO) reads."""
        b, idx = self.batch, idx.to(self.device)
        with torch.no_grad():
            params = self.agent.policy_params(b.obs[idx])
            return torch.exp(self.agent.head.log_prob(params, b.actions[idx]) - b.logp[idx]).cpu()

    def set_lr(self, lr: float) -> None:
        self.optimizer.set_lr(lr)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(s)
