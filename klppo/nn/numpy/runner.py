"""The rollout runner in numpy: acts with the flat weights it is handed, never a stale copy.

``act(obs [N, obs_dim]) -> (action, logp [N], params [N, param_dim], value [N])``, float32
numpy throughout, for ``ActorCritic`` with separate tanh MLPs: small matrix products in numpy
cost about a microsecond where each torch call costs several. The weights come from a
:class:`~klppo.nn.numpy.weights.FlatWeights` passed in (the numpy stack's row of the
policy, ``NumpySlot.weights``, which ``flat_weights(agent)`` returns too): the runner checks
with ``np.shares_memory`` that the agent's parameters view that buffer and that its layer views
lie in it, and refuses to act (:class:`~klppo.nn.numpy.weights.StaleWeights`) once the buffer
is superseded. Randomness comes from its own seeded generator, whose state is checkpointed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from klppo.nn.actor_critic import ActorCritic
from klppo.nn.distributions import CategoricalHead
from klppo.nn.numpy import mlp
from klppo.nn.numpy.heads import Categorical, Gaussian
from klppo.nn.numpy.weights import FlatWeights, StaleWeights, mlp_supported

__all__ = ["NumpyRunner"]


class NumpyRunner:
    """Acts with ``agent``'s policy through the flat ``weights`` (see the module docstring)."""

    def __init__(self, agent: ActorCritic, weights: FlatWeights, seed: int) -> None:
        if agent.trunk is not None or not (mlp_supported(agent.actor)
                                           and mlp_supported(agent.critic)):
            raise ValueError("NumpyRunner needs separate Linear/Tanh MLPs")
        weights.check(agent)
        self.weights = weights
        self.actor, self.critic = weights.mlp(agent.actor), weights.mlp(agent.critic)
        if not all(np.shares_memory(a, weights.flat) for layer in self.actor + self.critic
                   for a in layer):
            raise StaleWeights("a layer view is not in the weight buffer")
        self.head = (Categorical() if isinstance(agent.head, CategoricalHead) else
                     Gaussian(weights.view(agent.log_std)))
        self.rng = np.random.Generator(np.random.PCG64(seed))

    def _live(self) -> None:
        if self.weights.stale:
            raise StaleWeights("the network's weights moved to a new buffer since this runner "
                               "was built; build the runner again from flat_weights(agent)")

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Sample actions for ``obs``; see the module docstring for the shapes."""
        self._live()
        out = mlp.forward(self.actor, obs)[-1]
        value = mlp.forward(self.critic, obs)[-1][:, 0]
        return self.sample(out, value)

    def sample(self, out: np.ndarray, value: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`act` from the actor's output ``out [N, k or d]`` and ``value [N]`` computed
        elsewhere (a stack's one forward for a group of runs): actions drawn from this
        runner's generator."""
        action, logp, params = self.head.act(out, self.rng)
        return action, logp, params, value

    def value(self, obs: np.ndarray) -> np.ndarray:
        """``V(obs) [N]``."""
        self._live()
        return mlp.forward(self.critic, obs)[-1][:, 0]

    def state_dict(self) -> dict[str, Any]:
        return {"numpy_rng": self.rng.bit_generator.state}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.rng.bit_generator.state = s["numpy_rng"]
