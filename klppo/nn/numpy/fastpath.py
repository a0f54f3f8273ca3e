"""What the numpy fast path serves: separate tanh MLPs and objectives with a closed form.

On a small CPU network each torch call costs several microseconds and the autograd engine adds
more per node, so a 2x64 actor-critic step is dominated by overhead. The engine's numpy stack
(:mod:`klppo.rl.engine.numpy_stack`) therefore computes the step in numpy:

1. numpy forward of both MLPs (:mod:`~klppo.nn.numpy.mlp`) and the action head
   (:mod:`~klppo.nn.numpy.heads`: log-prob, entropy, analytic KL to the rollout policy);
2. the loss gradient per sample in closed form through the KLip-PPO template
   (:func:`~klppo.nn.numpy.closed_form.loss_grads`);
3. numpy backward through the head and the MLPs into one flat gradient buffer;
4. global-norm clip and Adam (:class:`~klppo.nn.numpy.adam.NumpyAdam`) on the flat weights
   (:func:`~klppo.nn.numpy.weights.flat_weights`), which the torch parameters are views of.

This module says which networks and objectives that computes exactly (:func:`fast_path_refusal`);
the rest train on the torch stack.
"""

from __future__ import annotations

from klppo.core.loss import PPOLoss
from klppo.nn.actor_critic import ActorCritic
from klppo.nn.numpy.weights import mlp_supported

__all__ = ["FastPathUnsupported", "fast_path_refusal", "supports_fast_path"]


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
