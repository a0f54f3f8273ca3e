"""A torch stack's per-step records of a rollout, kept on its device until the rollout ends.

Per env step the envs need every row's actions on the CPU (one transfer); the log-probabilities,
distribution parameters and values (:data:`RECORDS`) are written into tensors on the stack's
device and reach the stacked buffers once per rollout (:meth:`TorchRecords.to_cpu`: one
transfer per quantity), not once per step. On the CPU the records are torch views of the
buffers themselves: nothing to send.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["RECORDS", "TorchRecords"]

#: the per-step records a torch stack keeps on its device until the rollout ends
RECORDS = ("logp", "params", "values")
#: keep the records apart from the buffers on the CPU too, as on a GPU (a test sets it, to run
#: that path here)
APART_ON_CPU = False


class TorchRecords:
    """:data:`RECORDS` of the stacked buffers ``B`` (``{name: [R, T, N, ...]}``) on ``device``
    (see the module docstring)."""

    def __init__(self, B: dict[str, np.ndarray], device: torch.device) -> None:
        self.B = B
        self.apart = device.type != "cpu" or APART_ON_CPU
        views = {k: torch.from_numpy(B[k]) for k in RECORDS}
        self.rec = views if not self.apart else {
            k: torch.zeros(v.shape, dtype=v.dtype, device=device) for k, v in views.items()}

    def write(self, at: Any, t: int, logp: torch.Tensor, params: torch.Tensor,
              values: torch.Tensor) -> None:
        """Step ``t`` of the rows ``at`` (a slice or a list of rows)."""
        rec = self.rec
        rec["logp"][at, t], rec["params"][at, t], rec["values"][at, t] = logp, params, values

    def to_cpu(self) -> None:
        """The records kept apart into the buffers (one transfer per quantity)."""
        if self.apart:
            for name, x in self.rec.items():
                self.B[name][...] = x.cpu().numpy()
