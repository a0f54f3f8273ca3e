"""Acting with a policy during rollouts: a general torch runner, or the numpy one.

A runner turns a ``[N, obs_dim]`` float32 observation array into actions, their
log-probabilities, the distribution parameters and the values, all as numpy arrays. The numpy
runner (:class:`klppo.nn.numpy.NumpyRunner`) acts through the agent's flat weights, the buffer
the numpy step backend updates, and serves separate tanh MLPs (``ActorCritic`` without a shared
trunk); :class:`TorchRunner` serves any network. Both draw their randomness from their own
seeded generator, whose state is checkpointed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from klppo.nn.actor_critic import ActorCritic
from klppo.nn.numpy import NumpyRunner
from klppo.nn.numpy.weights import FlatWeights

__all__ = ["TorchRunner", "NumpyRunner", "make_runner"]


class TorchRunner:
    """Any ``ActorCritic``: torch forward under inference mode, sampling from a torch.Generator."""

    def __init__(self, agent: ActorCritic, seed: int) -> None:
        self.agent = agent
        self.head = agent.head
        self.device = next(agent.parameters()).device  # the generator samples where it acts
        self.gen = torch.Generator(device=self.device).manual_seed(seed)

    @torch.inference_mode()
    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return self.sample(*self.agent(torch.from_numpy(obs).to(self.device)))

    @torch.inference_mode()
    def sample(self, params: torch.Tensor, value: torch.Tensor
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`act` from distribution parameters ``[N, param_dim]`` and values ``[N]``
        computed elsewhere (a stack's one forward for a group of runs): actions drawn from
        this runner's generator."""
        action, logp = self.draw(params)
        return (action.cpu().numpy(), logp.cpu().numpy(), params.cpu().numpy(),
                value.cpu().numpy())

    @torch.inference_mode()
    def draw(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Actions drawn from this runner's generator at ``params`` and their log-probs, left
        on the device (a stack moves every run's to the CPU at once)."""
        action = self.head.sample(params, self.gen)
        return action, self.head.log_prob(params, action)

    @torch.inference_mode()
    def value(self, obs: np.ndarray) -> np.ndarray:
        """V(obs) ``[N]``, computed on a copy of the parameters in memory of its own: a run's
        parameters can view its row of a stack, and torch's CPU kernels round by where the
        weights lie in memory, so without the copy a run's values would depend on its row."""
        own = {k: p.clone() for k, p in self.agent.named_parameters()}
        obs_t = torch.from_numpy(obs).to(self.device)
        return torch.func.functional_call(self.agent, own, (obs_t,))[1].cpu().numpy()

    def state_dict(self) -> dict[str, Any]:
        return {"torch_generator": self.gen.get_state()}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.gen.set_state(s["torch_generator"])


def make_runner(agent: ActorCritic, seed: int, weights: FlatWeights | None = None
                ) -> TorchRunner | NumpyRunner:
    """The numpy runner on the stack row's ``weights`` (``NumpySlot.weights``), handed over
    explicitly, or the torch runner when there are none (the torch backend).

    The numpy runner checks with ``np.shares_memory`` that the agent's parameters view the
    buffer it is handed and refuses to act once that buffer is superseded
    (:class:`~klppo.nn.numpy.weights.StaleWeights`), so no construction order can make it act
    on weights the update does not write."""
    if weights is not None:
        return NumpyRunner(agent, weights, seed)
    return TorchRunner(agent, seed)
