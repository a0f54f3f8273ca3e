"""What one PPO minibatch step returns for one policy, whichever stack computed it.

The engine's stacks (:mod:`klppo.rl.engine.numpy_stack`, :mod:`klppo.rl.engine.torch_stack`)
step many policies at once and return one :class:`StepResult` per policy: numpy arrays from the
numpy stack, CPU tensors from the torch stack.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

__all__ = ["StepResult"]


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
