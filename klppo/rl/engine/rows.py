"""A policy as a row of a stack: where its parameters lie in the row, and its per-row backend.

Every network the engine trains is one row of a stack of networks of one shape (``W [R, P]``:
:mod:`~klppo.rl.engine.numpy_stack` or :mod:`~klppo.rl.engine.torch_stack`). The row's torch
parameters are views of it, so the checkpoint, the rollout runner and the stacked step read the
same numbers. :class:`Layout` says where each layer lies in a row; :class:`RowSlot` is what one
policy's learner holds of its stack: its learning rate and Adam state (its row of the stack's
Adam), and the probes an early stop, an actuator or a band controller takes on its own network
before a step (:meth:`RowSlot.k3`, :meth:`RowSlot.analytic_kl`, :meth:`RowSlot.ratio`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from klppo.core.kl import k3
from klppo.nn.actor_critic import ActorCritic
from klppo.nn.distributions import CategoricalHead
from klppo.nn.numpy.closed_form import rows_key
from klppo.rl.optim import check_adam_state, flat_adam_state

if TYPE_CHECKING:
    from klppo.core.loss import PPOLoss
    from klppo.nn.step import StepResult
    from klppo.rl.config import PPOConfig

__all__ = ["Layout", "RowSlot", "Minibatch", "TERMS", "Stack", "RowAdam", "loss_families"]

#: the loss terms a step reports (those the loss has)
TERMS = ("loss", "loss_objective", "loss_critic", "loss_entropy", "kl_penalty")

Span = tuple[int, int]


def loss_families(losses: list[Any]) -> list[list[int]]:
    """The positions of a step's ``losses`` grouped by
    :func:`~klppo.nn.numpy.closed_form.rows_key` (a token-level loss whose samples are
    independent, the same settings but beta): each group one ``[F, n]`` computation of its heads
    and losses (a stack's rows share one head: one layout); a loss without a key is a group of
    its own. Both stacks group their rows so."""
    if len(losses) == 1:  # a run alone: nothing to group
        return [[0]]
    by_key: dict[Any, list[int]] = {}
    for a, loss in enumerate(losses):
        key = rows_key(loss)
        by_key.setdefault(("alone", a) if key is None else key, []).append(a)
    return list(by_key.values())


class Layout:
    """Where the trunk's, actor's and critic's layers and the log-std lie in a row of ``P``
    floats, to view them in any ``[A, P]`` buffer as stacked layers ``(W [A, out, in],
    b [A, out])``. A network is ``trunk -> (actor, critic)`` with a shared trunk (the trunk's
    layers all end in tanh), else separate ``actor`` and ``critic`` MLPs (``trunk`` empty)."""

    def __init__(self, agent: ActorCritic, spans: Callable[[Any], Span]) -> None:
        def layers(mods: list[Any]) -> list[tuple[tuple[Span, tuple[int, ...]], ...]]:
            return [((spans(m.weight), tuple(m.weight.shape)), (spans(m.bias), tuple(m.bias.shape)))
                    for m in mods]

        def linears(seq: Any) -> list[Any]:
            return [m for m in (seq if isinstance(seq, torch.nn.Sequential) else [seq])
                    if isinstance(m, torch.nn.Linear)]

        self.trunk = layers(linears(agent.trunk)) if agent.trunk is not None else []
        self.actor, self.critic = layers(linears(agent.actor)), layers(linears(agent.critic))
        self.detach_trunk = bool(agent.trunk is not None and agent.separate_losses)
        self.categorical = isinstance(agent.head, CategoricalHead)
        self.log_std = None if self.categorical else spans(agent.log_std)
        self.shapes = [tuple(p.shape) for p in agent.parameters()]

    def same(self, other: Layout) -> bool:
        return vars(self) == vars(other)

    @staticmethod
    def _view(buf: Any, span: Span, shape: tuple[int, ...]) -> Any:
        return buf[:, span[0]:span[1]].reshape(buf.shape[0], *shape)

    def stacked(self, buf: Any, which: str) -> list[tuple[Any, Any]]:
        """The stacked layers of ``which`` (trunk, actor, critic): views of ``buf [A, P]``
        (a numpy array or a torch tensor)."""
        return [(self._view(buf, *w), self._view(buf, *b)) for w, b in getattr(self, which)]

    def layers(self, buf: Any) -> tuple[list[tuple[Any, Any]], list[tuple[Any, Any]]]:
        """The actor's and the critic's stacked layers, views of ``buf [A, P]``."""
        return self.stacked(buf, "actor"), self.stacked(buf, "critic")

    def policy_spans(self) -> list[Span]:
        """Where the policy's own parameters lie in a row: the actor's layers and the log-std
        (the critic's are the rest). A shared trunk belongs to both: refused."""
        if self.trunk:
            raise ValueError("a shared trunk is the actor's and the critic's: the policy's "
                             "parameters cannot be taken apart from the critic's")
        spans = [span for layer in self.actor for span, _ in layer]
        return spans + ([self.log_std] if self.log_std is not None else [])


def seat_row(stack: Any, row: int, layout: Layout, ppo: PPOConfig) -> None:
    """Row ``row`` joins ``stack``: the first row's ``layout`` becomes the stack's, a later one
    of another shape is refused; the row's Adam takes its run's lr, eps and gradient clip."""
    if not hasattr(stack, "layout"):
        stack.layout = layout
    elif not layout.same(stack.layout):
        raise ValueError(f"a stack holds networks of one shape: {layout.shapes} against "
                         f"{stack.layout.shapes}")
    a = stack.adam
    a.lr[row], a.eps[row], a.max_norm[row] = ppo.lr, ppo.adam_eps, ppo.max_grad_norm


class RowSlot:
    """One policy's side of its stack (see the module docstring). The stack steps all its rows
    at once, so this backend has no ``step`` of its own; ``begin`` keeps the rollout the
    probes read."""

    fast: bool = False
    stack: Stack
    row: int
    agent: ActorCritic
    batch: Any
    adv: Any
    device: torch.device

    def begin(self, batch: Any, adv: torch.Tensor) -> None:
        """Keep the rollout (on the stack's device) for this update's probes."""
        self.batch, self.adv = batch.to(self.device), adv

    def set_lr(self, lr: float) -> None:
        self.stack.adam.set_lr(self.row, lr)

    def state_dict(self) -> dict[str, Any]:
        """The row's Adam state (``lr``, flat ``m`` and ``v``, step ``t``): one format for both
        array libraries, so a checkpoint does not depend on the stack that wrote it."""
        return self.stack.adam.row_state(self.row)

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.stack.adam.load_row(self.row, check_adam_state(flat_adam_state(s),
                                                            int(self.stack.W.shape[1])))

    # ---------------------------------------------------------- the policy's own weights
    def policy_weights(self) -> np.ndarray:
        """A float32 copy of the row's policy parameters (:meth:`Layout.policy_spans`, in
        order), without the critic's: a snapshot a stale rollout acts with."""
        row = self.stack.W[self.row]
        parts = [row[s:e] for s, e in self.stack.layout.policy_spans()]
        if isinstance(row, torch.Tensor):
            return torch.cat(parts).cpu().numpy().copy()
        return np.concatenate(parts)

    def load_policy_weights(self, x: np.ndarray) -> None:
        """Write a :meth:`policy_weights` snapshot into the row (its critic is left as it is)."""
        row, at = self.stack.W[self.row], 0
        for s, e in self.stack.layout.policy_spans():
            part = x[at:at + e - s]
            row[s:e] = torch.from_numpy(part).to(row.device) if isinstance(
                row, torch.Tensor) else part
            at += e - s

    def log_prob(self, obs: np.ndarray, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The row's current policy at a rollout (numpy): its distribution parameters ``[B,
        param_dim]`` and the log-probabilities ``[B]`` of ``actions``, as its step computes
        them."""
        return self.stack.log_prob(self.row, obs, actions)

    def _params(self, idx: torch.Tensor) -> tuple[torch.Tensor, Any, torch.Tensor]:
        b, idx = self.batch, idx.to(self.device)
        return self.agent.policy_params(b.obs[idx]), b, idx

    @torch.no_grad()
    def k3(self, idx: torch.Tensor) -> float:
        """Sampled k3 KL(old || current) on a minibatch (nats per sample), before stepping on it:
        the mean of :func:`klppo.core.kl.k3` at ``log r = logp_current - logp_old``."""
        params, b, idx = self._params(idx)
        return float(k3(self.agent.head.log_prob(params, b.actions[idx]) - b.logp[idx]).mean())

    @torch.no_grad()
    def analytic_kl(self, idx: torch.Tensor) -> float:
        """Mean analytic KL(old || current) over the minibatch rows ``idx`` (per state, summed
        over action dimensions; nats per sample), before stepping on them: what an lr or clip
        actuator with before-step timing (rsl_rl's) is fed."""
        params, b, idx = self._params(idx)
        return float(self.agent.head.kl(b.params[idx], params).mean())

    @torch.no_grad()
    def ratio(self, idx: torch.Tensor) -> torch.Tensor:
        """Per-sample ratio ``w = pi_current(a|s) / pi_old(a|s)`` on the minibatch rows ``idx``,
        before stepping on them (``[n]``, on the CPU): what a clip-bound controller (BAPO)
        reads."""
        params, b, idx = self._params(idx)
        return torch.exp(self.agent.head.log_prob(params, b.actions[idx]) - b.logp[idx]).cpu()


@dataclass
class Minibatch:
    """The rows ``idx [A, n]`` of each stepping policy's rollout, gathered: ``obs [A, n,
    obs_dim]``, ``actions [A, n, ...]``, ``params [A, n, param_dim]`` (the rollout policy's),
    and ``logp``, ``adv`` (the advantages the step uses), ``returns``, ``values`` ``[A, n]``;
    ``weight [A, n]``, each sample's weight on the objective (None: 1 in every row)."""

    idx: Any
    obs: Any
    actions: Any
    params: Any
    logp: Any
    adv: Any
    returns: Any
    values: Any
    weight: Any = None


# ------------------------------------------------------------------ the stack, as its users see it
class RowAdam(Protocol):
    """Adam over the rows of a stack, each row its own learning rate and state."""

    def set_lr(self, r: int, lr: float) -> None: ...

    def row_state(self, r: int) -> dict[str, Any]: ...

    def load_row(self, r: int, s: dict[str, Any]) -> None: ...


class Stack(Protocol):
    """R networks of one shape, one row each (:class:`~klppo.rl.engine.numpy_stack.NumpyStack`,
    :class:`~klppo.rl.engine.torch_stack.TorchStack`): what a row slot, the collector and the
    learner call, so that mypy follows the hot path. ``fast``: the numpy stack (its rows act
    through the stack's own forward)."""

    @property
    def R(self) -> int: ...

    @property
    def fast(self) -> bool: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def W(self) -> Any: ...

    @property
    def adam(self) -> RowAdam: ...

    @property
    def layout(self) -> Layout: ...

    def maker(self, row: int, ppo: PPOConfig) -> Callable[[ActorCritic, PPOLoss], RowSlot]: ...

    def step(self, rows: np.ndarray, mb: Minibatch, losses: list[PPOLoss], betas: list[float],
             ws: Any, log: Any = None) -> list[StepResult]: ...

    def probe_k3(self, rows: np.ndarray, idx: np.ndarray, mb: Minibatch) -> list[float]: ...

    def policy_kl(self, rows: np.ndarray, obs: np.ndarray, old_params: np.ndarray,
                  ws: Any) -> list[float]: ...

    def log_prob(self, row: int, obs: np.ndarray, actions: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]: ...

    def act(self, obs: np.ndarray) -> tuple[Any, Any]: ...
