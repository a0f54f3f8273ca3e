"""Pure tensor math: KL estimators, beta controllers, PPO surrogates, values, GAE, diagnostics.

Imports torch and numpy only (numpy for the closed forms the numpy fast path runs, in
``objectives``, ``kl``, ``values`` and ``advantages``): no environments, files or loggers. No
global RNG state is kept; the one function that draws samples, ``monte_carlo_kl``, uses torch's
global generator unless it is given a ``seed`` (then it forks the generator and leaves it as it
was).
"""

from klppo.core._checks import validation
from klppo.core.advantages import gae, normalize_advantage
from klppo.core.controllers import KLController, make_controller
from klppo.core.kl import analytic_kl, full_kl, monte_carlo_kl, reduce_kl, sampled_kl
from klppo.core.loss import PPOLoss
from klppo.core.objectives import OBJECTIVES, Band, Knobs, Objective, ShapeSpec, make_objective
from klppo.core.surrogates import (
    clip_objective,
    partition,
    per_sample_beta,
    per_sample_kl_objective,
    phi_penalty,
)

__all__ = [
    "validation",
    "gae",
    "normalize_advantage",
    "KLController",
    "make_controller",
    "analytic_kl",
    "full_kl",
    "monte_carlo_kl",
    "reduce_kl",
    "sampled_kl",
    "PPOLoss",
    "OBJECTIVES",
    "Band",
    "Knobs",
    "Objective",
    "ShapeSpec",
    "make_objective",
    "clip_objective",
    "partition",
    "per_sample_beta",
    "per_sample_kl_objective",
    "phi_penalty",
]
