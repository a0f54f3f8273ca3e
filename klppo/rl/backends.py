"""Two step backends behind one contract (:mod:`klppo.nn.step`), and the one factory that chooses.

A backend applies one PPO minibatch step: ``begin(batch, advantages)`` once per update, then
``step(idx, beta) -> StepResult`` per minibatch. :class:`TorchStep` runs torch autograd and
:class:`ClippedAdam` on any ``ActorCritic``; :class:`~klppo.nn.numpy.NumpyStep` runs the numpy
fast path (:mod:`klppo.nn.numpy`: MLP forward/backward and Adam in numpy, the loss gradient from
the core's objective). Both keep their optimiser state in one format (flat Adam moments, see
:meth:`ClippedAdam.state_dict`), so a checkpoint does not depend on the backend that wrote it.

:func:`make_backend` picks the numpy backend when ``fast_path`` is on and the fast path can serve
the network and objective; otherwise torch, with the reason logged. The rollout runner follows the
same choice (``backend.fast``), so ``fast_path=False`` runs no numpy code at all.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from klppo.core.loss import PER_SAMPLE, PPOLoss
from klppo.nn.actor_critic import ActorCritic
from klppo.nn.numpy import NumpyStep, fast_path_refusal
from klppo.nn.step import StepBackend, StepResult
from klppo.rl.config import PPOConfig
from klppo.rl.optim import ClippedAdam
from klppo.runs.device import resolve_device

log = logging.getLogger(__name__)

__all__ = ["StepResult", "TorchStep", "NumpyStep", "make_backend", "resolve_device"]


def _cpu(t: torch.Tensor) -> torch.Tensor:
    """Detached, on the CPU (a no-op there)."""
    return t.detach().cpu()


class TorchStep(StepBackend):
    """Autograd through ``PPOLoss`` and a fused clipped Adam; any network."""

    fast = False

    def __init__(self, agent: ActorCritic, loss: PPOLoss, p: PPOConfig) -> None:
        self.agent, self.head, self.loss, self.p = agent, agent.head, loss, p
        self.device = next(agent.parameters()).device
        params = [q for q in agent.parameters() if q.requires_grad]
        self.optimizer = ClippedAdam(params, lr=p.lr, eps=p.adam_eps, max_norm=p.max_grad_norm)

    def begin(self, batch: Any, adv: torch.Tensor) -> None:
        """Keep the rollout (on the network's device) for this update's minibatches."""
        self.batch, self.adv = batch.to(self.device), adv.to(self.device)

    def step(self, idx: torch.Tensor, beta: float) -> StepResult:
        """One step; the detached outputs come back on the CPU (the diagnostics' device)."""
        b, needs_kl, cpu_idx, idx = self.batch, self.loss.needs_analytic_kl, idx, \
            idx.to(self.device)
        params, values = self.agent(b.obs[idx])
        logp_new = self.head.log_prob(params, b.actions[idx])
        with torch.set_grad_enabled(self.p.ent_coef > 0):
            entropy = self.head.entropy(params)
        with torch.set_grad_enabled(needs_kl):
            kl = self.head.kl(b.params[idx], params)
        out = self.loss(logp_new, b.logp[idx], self.adv[idx], values, b.returns[idx],
                        b.values[idx], entropy, kl if needs_kl else None, beta, diagnostics=False,
                        per_sample=True)
        grad_norm = self.optimizer.step(out["loss"])
        terms = {k: _cpu(out[k]) for k in ("loss", "loss_objective", "loss_critic",
                                           "loss_entropy", "kl_penalty") if k in out}
        samples = {k: _cpu(out[f"per_sample/{k}"]) for k in PER_SAMPLE
                   if f"per_sample/{k}" in out}
        return StepResult(cpu_idx, _cpu(logp_new), _cpu(values), _cpu(entropy), _cpu(kl),
                          _cpu(self.adv[idx]), _cpu(grad_norm), terms, samples)

    @torch.no_grad()
    def policy_kl(self, batch: Any) -> float:
        """Analytic KL(rollout policy || current policy), mean over the rollout."""
        b = batch.to(self.device)
        return float(self.head.kl(b.params, self.agent.policy_params(b.obs)).mean())


def make_backend(agent: ActorCritic, loss: PPOLoss, p: PPOConfig, fast_path: bool,
                 device: str = "cpu") -> TorchStep | NumpyStep:
    """The numpy backend when asked for and able to serve this network and objective exactly;
    else torch on ``device`` (the reason logged when the fast path was asked for). The numpy
    fast path runs on the CPU whatever ``device`` says, and says so."""
    dev = resolve_device(device)
    if fast_path:
        why = fast_path_refusal(agent, loss)
        if why is None:
            if dev.type != "cpu":
                log.warning("device %s: the numpy fast path runs on the CPU; add --no-fast-path "
                            "to train on %s with torch", dev, dev)
            return NumpyStep(agent, loss, p.lr, p.adam_eps, p.max_grad_norm)
        log.warning("numpy fast path off: %s; rolling out and updating with torch", why)
    agent.to(dev)
    return TorchStep(agent, loss, p)
