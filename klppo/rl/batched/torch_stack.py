"""The torch stack of R networks: the batched engine on ``--no-fast-path``, on the CPU or a GPU.

Where a run trains with torch (``fast_path: false``, or an objective or band the numpy fast path
cannot serve), its ordinary engine runs :class:`klppo.rl.backends.TorchStep` on ``device``. The
batched engine then stacks the runs' networks as one float32 tensor ``W [R, P]`` on that device:
row r holds run r's parameters in ``agent.parameters()`` order, and the agent's parameters are
views of it, so its checkpoint, its rollout runner (:class:`klppo.nn.runners.TorchRunner`) and
the stacked forward read the same numbers. Each run's optimiser is its row of a
:class:`StackedAdam`: :class:`klppo.rl.optim.ClippedAdam`'s rule (global-norm clip, then Adam)
applied row by row, in ``ClippedAdam``'s state format, so a checkpoint written here is one the
ordinary engine resumes and the other way round. The step itself is :mod:`.torch_step`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from klppo.core.loss import PPOLoss
from klppo.nn.actor_critic import ActorCritic
from klppo.rl.batched.stack import Layout, RowSlot
from klppo.rl.config import PPOConfig
from klppo.runs.device import resolve_device

__all__ = ["TorchRunStack", "TorchSlot", "StackedAdam"]

B1, B2 = 0.9, 0.999


class StackedAdam:
    """Per row of ``W [R, P]``: ``ClippedAdam``'s update (gradient scaled by
    ``1 / max(1, (|g| + 1e-6) / max_norm)``, then ``torch.optim.Adam``'s step), each row with
    its own learning rate, epsilon, clip norm and step count."""

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
        """Row ``r``'s state in :meth:`ClippedAdam.state_dict`'s format."""
        return {"lr": float(self.lr[r]), "m": self.m[r].cpu().numpy().copy(),
                "v": self.v[r].cpu().numpy().copy(), "t": int(self.t[r])}

    def load_row(self, r: int, s: dict[str, Any]) -> None:
        if "exp_avg" in s:
            raise ValueError("the batched engine resumes checkpoints written since the flat "
                             "optimiser format; resume this run with --engine process")
        dev = self.m.device
        self.lr[r] = float(s["lr"])
        self.m[r] = torch.as_tensor(np.asarray(s["m"], np.float32), device=dev)
        self.v[r] = torch.as_tensor(np.asarray(s["v"], np.float32), device=dev)
        self.t[r] = int(s["t"])


class TorchSlot(RowSlot):
    """Run r's step backend in a torch stack (see :class:`~klppo.rl.batched.stack.RowSlot`),
    its rollout on the stack's device."""

    fast = False

    def __init__(self, stack: TorchRunStack, row: int, agent: ActorCritic,
                 loss: PPOLoss) -> None:
        self.stack, self.row, self.agent, self.loss = stack, row, agent, loss
        self.head, self.device = agent.head, stack.device

    def begin(self, batch: Any, adv: torch.Tensor) -> None:
        self.batch, self.adv = batch.to(self.device), adv.to(self.device)


class TorchRunStack:
    """R networks of one shape stacked row by row on one device (see the module docstring); a
    run's network joins at its construction through :meth:`maker`."""

    def __init__(self, runs: int, device: str) -> None:
        self.R, self.device = runs, resolve_device(device)
        self.W: torch.Tensor | None = None
        self.adam: StackedAdam | None = None
        self.layout: Layout | None = None
        self.slots: list[TorchSlot | None] = [None] * runs

    def maker(self, row: int, ppo: PPOConfig) -> Callable[[ActorCritic, PPOLoss], TorchSlot]:
        """The ``make_step`` of run ``row`` (see :class:`klppo.rl.unit.PolicyUnit`)."""
        return lambda agent, loss: self._join(row, agent, loss, ppo)

    def _join(self, row: int, agent: ActorCritic, loss: PPOLoss, ppo: PPOConfig) -> TorchSlot:
        if agent.trunk is not None:
            raise ValueError("the batched engine cannot run this: net.shared_trunk (it stacks "
                             "two separate tanh MLPs)")
        params = list(agent.parameters())
        total = sum(p.numel() for p in params)
        if self.W is None:
            self.W = torch.zeros(self.R, total, dtype=torch.float32, device=self.device)
            self.adam = StackedAdam(self.W)
        spans, at = {}, 0
        for p in params:  # the parameters become views of row `row`
            n = p.numel()
            self.W[row, at:at + n] = p.detach().reshape(-1).to(self.device)
            p.data = self.W[row, at:at + n].view(p.shape)
            spans[id(p)] = (at, at + n)
            at += n
        layout = Layout(agent, lambda p: spans[id(p)])
        if self.layout is None:
            self.layout = layout
        elif vars(layout) != vars(self.layout):
            raise ValueError(f"the batched engine stacks networks of one shape: "
                             f"{layout.shapes} against {self.layout.shapes}")
        a = self.adam
        a.lr[row], a.eps[row], a.max_norm[row] = ppo.lr, ppo.adam_eps, ppo.max_grad_norm
        slot = self.slots[row] = TorchSlot(self, row, agent, loss)
        return slot
