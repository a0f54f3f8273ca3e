"""Actor-critic networks and action-distribution heads."""

from klppo.nn.actor_critic import ActorCritic, layer_init, make_head, mlp
from klppo.nn.distributions import CategoricalHead, DiagGaussianHead

__all__ = ["ActorCritic", "layer_init", "make_head", "mlp", "CategoricalHead", "DiagGaussianHead"]
