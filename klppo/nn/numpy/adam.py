"""Global-norm gradient clipping and Adam on the flat buffers, in place.

With ``g`` the flat gradient ``[P]``: ``g <- g * max_norm / (|g| + 1e-6)`` when that factor is
below 1 (torch's ``clip_grad_norm_``), then Adam (Kingma & Ba 2015) exactly as
``torch.optim.Adam`` computes it: ``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g^2``,
``p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)``. The state format
(``lr``, flat ``m`` and ``v``, step ``t``) is the torch backend's too
(:class:`klppo.rl.optim.ClippedAdam`), so a checkpoint does not depend on the backend.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["FlatAdam"]


class FlatAdam:
    """Clip and Adam over ``params`` (float32 ``[P]``) from ``grad`` (the same shape)."""

    def __init__(self, params: np.ndarray, grad: np.ndarray, lr: float, eps: float,
                 max_norm: float) -> None:
        self.params, self.grad = params, grad
        self.lr, self.eps, self.max_norm = lr, eps, max_norm
        self.m = np.zeros_like(params)
        self.v = np.zeros_like(params)
        self._tmp, self._denom = np.empty_like(params), np.empty_like(params)
        self.t = 0

    def set_lr(self, lr: float) -> None:
        self.lr = float(lr)

    def step(self) -> float:
        """Clip ``grad`` and apply one Adam step to ``params``; return the pre-clip norm."""
        g = self.grad
        norm = float(np.sqrt(np.dot(g, g)))
        coef = self.max_norm / (norm + 1e-6)
        if coef < 1.0:
            g *= np.float32(coef)
        self.t += 1
        b1, b2 = 0.9, 0.999
        t, denom = self._tmp, self._denom  # the textbook expressions, in place
        self.m *= b1
        np.multiply(g, 1 - b1, out=t)
        self.m += t                                   # m = b1 m + (1 - b1) g
        self.v *= b2
        np.multiply(g, 1 - b2, out=t)
        np.multiply(t, g, out=t)
        self.v += t                                   # v = b2 v + (1 - b2) g g
        np.sqrt(self.v, out=denom)
        np.divide(denom, np.float32(np.sqrt(1 - b2**self.t)), out=denom)
        denom += np.float32(self.eps)
        np.multiply(self.m, np.float32(self.lr / (1 - b1**self.t)), out=t)
        np.divide(t, denom, out=t)
        self.params -= t                              # p -= lr_t m / (sqrt(v_hat) + eps)
        return norm

    def state_dict(self) -> dict[str, Any]:
        """Adam state (the parameters themselves live in the model's state_dict)."""
        return {"lr": self.lr, "m": self.m.copy(), "v": self.v.copy(), "t": self.t}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.lr, self.t = float(s["lr"]), int(s["t"])
        self.m[:] = s["m"]
        self.v[:] = s["v"]
