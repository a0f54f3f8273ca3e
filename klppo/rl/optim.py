"""Adam with the global grad-norm clip folded into one fused step.

Equivalent to ``clip_grad_norm_(params, max_norm)`` followed by ``torch.optim.Adam.step()``, but
the clip is applied as the fused kernel's ``grad_scale`` (gradients divided by
``1 / clip_coef``) and gradients come from ``torch.autograd.grad``, so no ``.grad`` fields are
allocated, zeroed or accumulated. Falls back to the foreach implementation where torch has no
fused CPU Adam (torch < 2.4).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["ClippedAdam"]

_HAS_FUSED = hasattr(torch, "_fused_adam_")


class ClippedAdam:
    """``step(loss)``: gradients of ``loss``, global-norm clip at ``max_norm``, Adam update.

    Args:
        params: the parameters to optimise.
        lr: learning rate (change with :meth:`set_lr`).
        eps: Adam epsilon. betas: Adam betas.
        max_norm: global gradient-norm clip (inf disables it).
    """

    def __init__(self, params: Sequence[torch.nn.Parameter], lr: float, eps: float = 1e-8,
                 betas: tuple[float, float] = (0.9, 0.999), max_norm: float = float("inf"),
                 fused: bool | None = None) -> None:
        self.params = list(params)
        self.lr, self.eps, self.betas, self.max_norm = float(lr), float(eps), betas, max_norm
        on_cpu = all(p.device.type == "cpu" for p in self.params)
        self.fused = on_cpu and (_HAS_FUSED if fused is None else (fused and _HAS_FUSED))
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]
        self.steps = [torch.zeros((), dtype=torch.float32) for _ in self.params]
        self._one = torch.ones((), dtype=torch.float32)

    def set_lr(self, lr: float) -> None:
        self.lr = float(lr)

    def step(self, loss: torch.Tensor) -> torch.Tensor:
        """Apply one update from ``loss``; return the pre-clip global gradient norm (0-d)."""
        grads = list(torch.autograd.grad(loss, self.params))
        norms = torch._foreach_norm(grads)
        total = torch.linalg.vector_norm(torch.stack(norms))
        # clip_grad_norm_'s rule: scale by max_norm / (norm + 1e-6) when that is below 1
        inv_coef = torch.clamp((total + 1e-6) / self.max_norm, min=1.0)
        with torch.no_grad():
            if self.fused:
                torch._foreach_add_(self.steps, 1.0)  # the kernel expects the step counted
                torch._fused_adam_(
                    self.params, grads, self.exp_avg, self.exp_avg_sq, [], self.steps,
                    lr=self.lr, beta1=self.betas[0], beta2=self.betas[1], weight_decay=0.0,
                    eps=self.eps, amsgrad=False, maximize=False, grad_scale=inv_coef,
                    found_inf=None,
                )
            else:
                torch._foreach_div_(grads, inv_coef)
                self._foreach_step(grads)
        return total.detach()

    def _foreach_step(self, grads: list[torch.Tensor]) -> None:
        b1, b2 = self.betas
        torch._foreach_add_(self.steps, 1.0)
        torch._foreach_lerp_(self.exp_avg, grads, 1 - b1)
        torch._foreach_mul_(self.exp_avg_sq, b2)
        torch._foreach_addcmul_(self.exp_avg_sq, grads, grads, 1 - b2)
        for p, m, v, s in zip(self.params, self.exp_avg, self.exp_avg_sq, self.steps):
            t = float(s)
            denom = (v.sqrt() / (1 - b2**t) ** 0.5).add_(self.eps)
            p.addcdiv_(m, denom, value=-self.lr / (1 - b1**t))

    def state_dict(self) -> dict[str, Any]:
        """``{"lr", "m", "v", "t"}`` with the moments as flat float32 arrays in parameter order:
        the format of the numpy fast path's Adam too, so checkpoints do not depend on the
        backend."""
        flat = lambda ts: np.concatenate([t.detach().reshape(-1).cpu().numpy() for t in ts])  # noqa: E731,E501
        return {"lr": self.lr, "m": flat(self.exp_avg), "v": flat(self.exp_avg_sq),
                "t": int(self.steps[0]) if self.steps else 0}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.lr = float(s["lr"])
        if "exp_avg" in s:  # checkpoints written before the flat format
            m, v = (torch.cat([t.reshape(-1) for t in s[k]]).numpy() for k in ("exp_avg",
                                                                              "exp_avg_sq"))
            t = int(s["steps"][0]) if s["steps"] else 0
        else:
            m, v, t = np.asarray(s["m"]), np.asarray(s["v"]), int(s["t"])
        at = 0
        for dm, dv, ds in zip(self.exp_avg, self.exp_avg_sq, self.steps):
            n = dm.numel()
            dm.copy_(torch.from_numpy(m[at:at + n].copy()).view(dm.shape).to(dm.device))
            dv.copy_(torch.from_numpy(v[at:at + n].copy()).view(dv.shape).to(dv.device))
            ds.fill_(t)
            at += n
