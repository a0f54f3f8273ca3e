"""Global-norm gradient clipping and Adam for a stack of torch parameter rows: the one torch
Adam (the engine's torch stack, :mod:`klppo.rl.engine.torch_stack`).

Per row of ``W [R, P]`` (one policy's flat parameters, on any device): the gradient is scaled by
``1 / max(1, (|g| + 1e-6) / max_norm)`` (``clip_grad_norm_``'s rule), then ``torch.optim.Adam``'s
update, each row with its own learning rate, epsilon, clip norm and step count. The state of a
row (``lr``, flat ``m`` and ``v``, step ``t``) has the numpy stack's format
(:class:`klppo.nn.numpy.adam.NumpyAdam`), so a checkpoint does not depend on the array library.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["TorchAdam", "flat_adam_state", "check_adam_state"]

B1, B2 = 0.9, 0.999


def flat_adam_state(s: dict[str, Any]) -> dict[str, Any]:
    """An Adam state in the flat format; checkpoints written before it held per-parameter
    ``exp_avg`` / ``exp_avg_sq`` lists and ``steps``, converted here."""
    if "exp_avg" not in s:
        return s
    m, v = (torch.cat([t.reshape(-1) for t in s[k]]).numpy() for k in ("exp_avg", "exp_avg_sq"))
    return {"lr": s["lr"], "m": m, "v": v, "t": int(s["steps"][0]) if s["steps"] else 0}


def check_adam_state(s: dict[str, Any], size: int) -> dict[str, Any]:
    """``s`` when it is an Adam row state of ``size`` parameters (a learning rate > 0, a step
    count >= 0, finite moments of that size, the second one >= 0); ValueError naming the part
    otherwise (a forged or damaged checkpoint, refused before any step)."""
    lr, t = s.get("lr"), s.get("t")
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not 0 < lr < float("inf"):
        raise ValueError(f"optimizer.lr={lr!r}: must be a finite number > 0")
    if not isinstance(t, (int, np.integer)) or isinstance(t, bool) or t < 0:
        raise ValueError(f"optimizer.t={t!r}: must be a step count >= 0")
    for k in ("m", "v"):
        a = np.asarray(s.get(k))
        if a.shape != (size,) or not np.issubdtype(a.dtype, np.floating):
            raise ValueError(f"optimizer.{k} has shape {list(a.shape)} ({a.dtype}), the network "
                             f"{size} float parameters")
        if not np.isfinite(a).all() or (k == "v" and (a < 0).any()):
            raise ValueError(f"optimizer.{k}: holds non-finite or (second moment) negative "
                             f"values")
    return s


class TorchAdam:
    """Clip and Adam per row of ``W [R, P]`` (see the module docstring)."""

    def __init__(self, W: torch.Tensor) -> None:
        R, dev = W.shape[0], W.device
        self.m, self.v = torch.zeros_like(W), torch.zeros_like(W)
        self.t = torch.zeros(R, dtype=torch.float64, device=dev)
        self.lr = torch.zeros(R, dtype=torch.float64, device=dev)
        self.eps = torch.ones(R, dtype=torch.float64, device=dev)
        self.max_norm = torch.full((R,), float("inf"), dtype=torch.float64, device=dev)

    @torch.no_grad()
    def step(self, W: torch.Tensor, G: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Update ``W[rows]`` in place from their gradients ``G [A, P]``; the pre-clip norms."""
        norms = torch.linalg.vector_norm(G, dim=1)
        inv = torch.clamp((norms.double() + 1e-6) / self.max_norm[rows], min=1.0)
        g = G / inv.float()[:, None]
        t = self.t[rows] + 1
        self.t[rows] = t
        m = torch.lerp(self.m[rows], g, 1 - B1)
        v = self.v[rows] * B2 + (1 - B2) * g * g
        self.m[rows], self.v[rows] = m, v
        bias2 = torch.sqrt(1 - B2 ** t).float()[:, None]
        denom = v.sqrt() / bias2 + self.eps[rows].float()[:, None]
        step = (self.lr[rows] / (1 - B1 ** t)).float()[:, None]
        W[rows] = W[rows] - step * m / denom
        return norms

    def set_lr(self, r: int, lr: float) -> None:
        self.lr[r] = float(lr)

    def row_state(self, r: int) -> dict[str, Any]:
        """Row ``r``'s state: ``lr``, flat ``m`` and ``v`` (numpy), step ``t``."""
        return {"lr": float(self.lr[r]), "m": self.m[r].cpu().numpy().copy(),
                "v": self.v[r].cpu().numpy().copy(), "t": int(self.t[r])}

    def load_row(self, r: int, s: dict[str, Any]) -> None:
        dev = self.m.device
        self.lr[r] = float(s["lr"])
        self.m[r] = torch.as_tensor(np.asarray(s["m"], np.float32), device=dev)
        self.v[r] = torch.as_tensor(np.asarray(s["v"], np.float32), device=dev)
        self.t[r] = int(s["t"])
