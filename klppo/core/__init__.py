"""Pure tensor math: KL estimators, beta controllers, PPO surrogates, values, GAE, diagnostics.

Imports torch and numpy only (numpy for the closed forms the numpy fast path runs, in
``objectives``, ``kl``, ``values`` and ``advantages``): no environments, files or loggers. No
global RNG state is kept; the one function that draws samples, ``monte_carlo_kl``, uses torch's
global generator unless it is given a ``seed`` (then it forks the generator and leaves it as it
was).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: each public name and the module that defines it; imported on first use (PEP 562), so that
#: ``import klppo.core.names`` (what configs and ``--help`` need) does not import torch
_WHERE = {
    "validation": "_checks",
    "gae": "advantages", "normalize_advantage": "advantages",
    "KLController": "controllers", "make_controller": "controllers",
    "analytic_kl": "kl", "full_kl": "kl", "monte_carlo_kl": "kl", "reduce_kl": "kl",
    "sampled_kl": "kl",
    "PPOLoss": "loss",
    "OBJECTIVES": "objectives", "Band": "objectives", "Knobs": "objectives",
    "Objective": "objectives", "ShapeSpec": "objectives", "make_objective": "objectives",
    "clip_objective": "surrogates", "partition": "surrogates", "per_sample_beta": "surrogates",
    "per_sample_kl_objective": "surrogates", "phi_penalty": "surrogates",
}

__all__ = [
    "validation", "gae", "normalize_advantage", "KLController", "make_controller",
    "analytic_kl", "full_kl", "monte_carlo_kl", "reduce_kl", "sampled_kl", "PPOLoss",
    "OBJECTIVES", "Band", "Knobs", "Objective", "ShapeSpec", "make_objective",
    "clip_objective", "partition", "per_sample_beta", "per_sample_kl_objective", "phi_penalty",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'klppo.core' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"klppo.core.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))


if TYPE_CHECKING:
    from klppo.core._checks import validation
    from klppo.core.advantages import gae, normalize_advantage
    from klppo.core.controllers import KLController, make_controller
    from klppo.core.kl import analytic_kl, full_kl, monte_carlo_kl, reduce_kl, sampled_kl
    from klppo.core.loss import PPOLoss
    from klppo.core.objectives import (
        OBJECTIVES,
        Band,
        Knobs,
        Objective,
        ShapeSpec,
        make_objective,
    )
    from klppo.core.surrogates import (
        clip_objective,
        partition,
        per_sample_beta,
        per_sample_kl_objective,
        phi_penalty,
    )
