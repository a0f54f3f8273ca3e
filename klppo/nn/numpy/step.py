"""The numpy step backend: one PPO minibatch step for ``ActorCritic`` with separate tanh MLPs.

On a small CPU network each torch call costs several microseconds and the autograd engine adds
more per node, so a 2x64 actor-critic step is dominated by overhead. This backend splits it:

1. numpy forward of both MLPs (:mod:`~klppo.nn.numpy.mlp`) and the action head
   (:mod:`~klppo.nn.numpy.heads`: log-prob, entropy, analytic KL to the rollout policy);
2. the loss gradient per sample in closed form through the KLip-PPO template
   (:func:`~klppo.nn.numpy.closed_form.loss_grads`);
3. numpy backward through the head and the MLPs into one flat gradient buffer;
4. global-norm clip and Adam (:class:`~klppo.nn.numpy.adam.FlatAdam`) on the flat weights
   (:func:`~klppo.nn.numpy.weights.flat_weights`), which the torch parameters are views of.

It keeps the step-backend contract of :mod:`klppo.nn.step`; ``tests/nn/numpy/test_step.py``
checks it against torch autograd + ``torch.optim.Adam`` for every objective of the registry.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from klppo.core.loss import PPOLoss
from klppo.nn.actor_critic import ActorCritic
from klppo.nn.distributions import CategoricalHead
from klppo.nn.numpy import mlp
from klppo.nn.numpy.adam import FlatAdam
from klppo.nn.numpy.closed_form import loss_grads
from klppo.nn.numpy.heads import Categorical, Gaussian
from klppo.nn.numpy.weights import flat_weights, mlp_supported
from klppo.nn.step import StepBackend, StepResult

__all__ = ["NumpyStep", "FastPathUnsupported", "fast_path_refusal", "supports_fast_path"]

_TERMS = ("loss", "loss_objective", "loss_critic", "loss_entropy", "kl_penalty")


def supports_fast_path(agent: ActorCritic) -> bool:
    """Separate MLPs made of Linear layers with Tanh between them, no shared trunk."""
    return agent.trunk is None and mlp_supported(agent.actor) and mlp_supported(agent.critic)


class FastPathUnsupported(ValueError):
    """The fast path cannot serve this network or objective; the message says why."""


def fast_path_refusal(agent: ActorCritic, loss: PPOLoss) -> str | None:
    """Why the numpy fast path cannot run this agent and loss exactly, or None when it can."""
    if not supports_fast_path(agent):
        return "the network is not two separate Linear/Tanh MLPs (a shared trunk?)"
    if not loss.policy.has_closed_form:
        return (f"objective {loss.objective!r} has no closed-form derivative "
                f"(klppo.core.objectives.Objective.closed_form)")
    if not loss.policy.band.is_scalar:
        return "per-sample (tensor) clip bands are not supported by the fast path"
    return None


class NumpyStep(StepBackend):
    """Forward, loss, backward, clip and Adam in numpy, in place on the agent's flat weights
    (``self.weights``, the buffer the rollout runner is handed too)."""

    fast = True
    device = torch.device("cpu")

    def __init__(self, agent: ActorCritic, loss: PPOLoss, lr: float, adam_eps: float,
                 max_grad_norm: float) -> None:
        why = fast_path_refusal(agent, loss)
        if why is not None:
            raise FastPathUnsupported(f"the numpy fast path cannot run this: {why}")
        self.agent, self.loss = agent, loss
        self.weights = w = flat_weights(agent)
        self.grad = np.zeros_like(w.flat)
        self.optimizer = FlatAdam(w.flat, self.grad, lr, adam_eps, max_grad_norm)
        self.actor, self.critic = w.mlp(agent.actor), w.mlp(agent.critic)
        self.g_actor, self.g_critic = w.mlp(agent.actor, self.grad), w.mlp(agent.critic,
                                                                             self.grad)
        self.ws = mlp.Workspace()
        self.head = (Categorical() if isinstance(agent.head, CategoricalHead) else
                     Gaussian(w.view(agent.log_std), w.view(agent.log_std, self.grad)))

    # ------------------------------------------------------------- the backend contract
    def begin(self, batch: Any, adv: torch.Tensor) -> None:
        """Keep the rollout's arrays (zero-copy numpy views) for this update's minibatches."""
        self.batch = batch
        self.np = {k: getattr(batch, k).numpy() for k in ("obs", "actions", "logp", "params",
                                                          "values", "returns")}
        self.adv = adv.numpy()

    def step(self, idx: torch.Tensor, beta: float) -> StepResult:
        """One step on the rows ``idx`` of the rollout; numpy per-sample outputs."""
        i, npb = idx.numpy(), self.np  # ndarray.take: np.take's result without its dispatch
        a_i = self.adv.take(i)
        r = self.step_arrays(
            npb["obs"].take(i, 0), npb["actions"].take(i, 0), npb["params"].take(i, 0),
            npb["logp"].take(i), a_i, npb["returns"].take(i), npb["values"].take(i), beta)
        terms = {k: r[k] for k in _TERMS if k in r}
        return StepResult(i, r["logp"], r["values"], r["entropy"], r["kl"], a_i,
                          r["grad_norm"], terms, r["samples"])

    def policy_kl(self, batch: Any) -> float:
        """Analytic KL(rollout policy || current policy), mean over the rollout (nats)."""
        return self.policy_kl_arrays(batch.obs.numpy(), batch.params.numpy())

    # ------------------------------------------------------------- on arrays
    def step_arrays(self, obs, actions, old_params, logp_old, adv, returns, old_values,
                    beta: float) -> dict[str, Any]:
        """Apply one update from float32 arrays (``obs [n, obs_dim]``, ``actions``,
        ``old_params [n, param_dim]``, the rest ``[n]``); return the per-sample outputs
        (``logp``, ``values``, ``entropy``, ``kl``), the loss terms, ``grad_norm`` and
        ``samples`` (what the gradient used, see :func:`~klppo.nn.numpy.closed_form.loss_grads`)."""
        a_acts = mlp.forward(self.actor, obs, self.ws, "actor")
        c_acts = mlp.forward(self.critic, obs, self.ws, "critic")
        out, value = a_acts[-1], c_acts[-1][:, 0].copy()  # buffers are reused: copy what leaves
        logp, entropy, kl, backward = self.head.step(out, actions, old_params)
        terms, g_logp, g_val, g_ent, g_kl, samples = loss_grads(
            self.loss, logp.astype(np.float32, copy=False), logp_old, adv, value, returns,
            old_values, entropy, kl.astype(np.float32, copy=False), beta)
        g_out = backward(g_logp, g_ent, g_kl)
        mlp.backward(self.actor, self.g_actor, a_acts, g_out.astype(np.float32, copy=False),
                     self.ws)
        mlp.backward(self.critic, self.g_critic, c_acts, np.ascontiguousarray(g_val[:, None]),
                     self.ws)
        norm = self.optimizer.step()
        return {"logp": logp, "values": value, "entropy": entropy, "kl": kl, "grad_norm": norm,
                "samples": samples, **terms}

    def policy_kl_arrays(self, obs: np.ndarray, old_params: np.ndarray) -> float:
        """Mean analytic KL(old || current) over ``obs`` (nats per sample), numpy forward."""
        out = mlp.forward(self.actor, obs, self.ws, "actor")[-1]
        return self.head.kl_mean(out, old_params)
