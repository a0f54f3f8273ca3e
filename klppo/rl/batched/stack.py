"""The networks of R runs as one stack: float32 weights ``[R, P]``, gradients and Adam per row.

Row r is run r's flat weight buffer (:func:`klppo.nn.numpy.weights.flat_weights` on that row):
its torch parameters view it, so its checkpoint, its rollout runner and the stacked forward all
read the same numbers. Each run's step backend is a :class:`SlotBackend`: its learning rate and
Adam state are its row of a :class:`~klppo.nn.numpy.adam.StackedAdam`, saved in the numpy step's
format, so a checkpoint written here is one the ordinary engine resumes and the other way round.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from klppo.core.loss import PPOLoss
from klppo.nn.actor_critic import ActorCritic
from klppo.nn.distributions import CategoricalHead
from klppo.nn.numpy import fast_path_refusal, flat_weights
from klppo.nn.numpy.adam import StackedAdam
from klppo.nn.numpy.heads import Categorical, Gaussian
from klppo.nn.step import StepBackend
from klppo.rl.config import PPOConfig

__all__ = ["RunStack", "SlotBackend", "RowSlot", "Layout"]

Span = tuple[int, int]
Layer = tuple[np.ndarray, np.ndarray]


class Layout:
    """Where the actor's and critic's layers and the log-std lie in a row of ``P`` floats, to
    view them in any ``[A, P]`` buffer as stacked layers ``(W [A, out, in], b [A, out])``."""

    def __init__(self, agent: ActorCritic, spans: Callable[[Any], Span]) -> None:
        def layers(seq):
            return [((spans(m.weight), tuple(m.weight.shape)), (spans(m.bias), tuple(m.bias.shape)))
                    for m in list(seq)[::2]]
        self.actor, self.critic = layers(agent.actor), layers(agent.critic)
        self.categorical = isinstance(agent.head, CategoricalHead)
        self.log_std = None if self.categorical else spans(agent.log_std)
        self.shapes = [tuple(p.shape) for p in agent.parameters()]

    @staticmethod
    def _view(buf: np.ndarray, span: Span, shape: tuple[int, ...]) -> np.ndarray:
        return buf[:, span[0]:span[1]].reshape(buf.shape[0], *shape)

    def layers(self, buf: np.ndarray) -> tuple[list[Layer], list[Layer]]:
        """The actor's and the critic's stacked layers, views of ``buf [A, P]``."""
        def view(spec):
            return [(self._view(buf, *w), self._view(buf, *b)) for w, b in spec]
        return view(self.actor), view(self.critic)

    def head(self, row: np.ndarray, grad_row: np.ndarray | None = None) -> Categorical | Gaussian:
        """The numpy action head of one row of weights (and of its gradient)."""
        if self.categorical:
            return Categorical()
        s, e = self.log_std
        return Gaussian(row[s:e], None if grad_row is None else grad_row[s:e])


class RowSlot(StepBackend):
    """What a run's step backend in any stack is: its row's learning rate and Adam state (the
    stack's ``adam``: ``set_lr``, ``row_state``, ``load_row``) and the k3 early-stop check on
    its own network (:meth:`StepBackend.k3`). The stack steps all runs at once, so ``step`` and
    ``policy_kl`` belong to the engine."""

    stack: Any
    row: int

    def set_lr(self, lr: float) -> None:
        self.stack.adam.set_lr(self.row, lr)

    def state_dict(self) -> dict[str, Any]:
        return self.stack.adam.row_state(self.row)

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.stack.adam.load_row(self.row, s)

    def step(self, idx: torch.Tensor, beta: float) -> Any:
        raise RuntimeError("a run of the batched engine steps with its stack "
                           "(klppo.rl.batched.step or torch_step), not alone")

    def policy_kl(self, batch: Any) -> float:
        raise RuntimeError("a run of the batched engine measures its rollout KL with its stack")


class SlotBackend(RowSlot):
    """Run r's step backend in the numpy stack (see :class:`RowSlot`)."""

    fast = True
    device = torch.device("cpu")

    def __init__(self, stack: RunStack, row: int, agent: ActorCritic, loss: PPOLoss,
                 weights: Any) -> None:
        self.stack, self.row, self.agent, self.loss = stack, row, agent, loss
        self.weights = weights  # the run's flat weights: its row of the stack

    def begin(self, batch: Any, adv: torch.Tensor) -> None:
        """Keep the rollout for the early-stop check of this update."""
        self.batch, self.adv = batch, adv


class RunStack:
    """R networks of one shape stacked row by row (see the module docstring). A run's network
    joins at its construction through :meth:`maker` (its row, its Adam settings)."""

    def __init__(self, runs: int) -> None:
        self.R = runs
        self.W: np.ndarray | None = None
        self.G: np.ndarray | None = None
        self.adam: StackedAdam | None = None
        self.layout: Layout | None = None
        self.slots: list[SlotBackend | None] = [None] * runs
        self._full: tuple[list[Layer], list[Layer], list[Layer], list[Layer]] | None = None
        self._heads: list[Categorical | Gaussian | None] = [None] * runs

    def maker(self, row: int, ppo: PPOConfig) -> Callable[[ActorCritic, PPOLoss], SlotBackend]:
        """The ``make_step`` of run ``row`` (see :class:`klppo.rl.unit.PolicyUnit`)."""
        return lambda agent, loss: self._join(row, agent, loss, ppo)

    def _join(self, row: int, agent: ActorCritic, loss: PPOLoss, ppo: PPOConfig) -> SlotBackend:
        why = fast_path_refusal(agent, loss)
        if why is not None:
            raise ValueError(f"the batched engine cannot run this: {why}")
        total = sum(p.numel() for p in agent.parameters())
        if self.W is None:
            self.W = np.zeros((self.R, total), np.float32)
            self.G = np.zeros_like(self.W)
            self.adam = StackedAdam(self.W, np.full(self.R, ppo.lr), np.full(self.R, ppo.adam_eps),
                                    np.full(self.R, ppo.max_grad_norm))
        weights = flat_weights(agent, self.W[row])
        layout = Layout(agent, weights.span)
        if self.layout is None:
            self.layout = layout
        elif vars(layout) != vars(self.layout):
            raise ValueError(f"the batched engine stacks networks of one shape: "
                             f"{layout.shapes} against {self.layout.shapes}")
        self.adam.lr[row], self.adam.eps[row] = ppo.lr, ppo.adam_eps
        self.adam.max_norm[row] = ppo.max_grad_norm
        slot = self.slots[row] = SlotBackend(self, row, agent, loss, weights)
        return slot

    # ------------------------------------------------------------------ views
    def full(self) -> tuple[list[Layer], list[Layer], list[Layer], list[Layer]]:
        """Stacked layers of every row: actor, critic, and their gradients' (views, cached)."""
        if self._full is None:
            self._full = (*self.layout.layers(self.W), *self.layout.layers(self.G))
        return self._full

    def head(self, row: int) -> Categorical | Gaussian:
        """Row ``row``'s action head on the stack's own weights and gradient (cached)."""
        h = self._heads[row]
        if h is None:
            h = self._heads[row] = self.layout.head(self.W[row], self.G[row])
        return h
