"""The engine's seams as ``typing.Protocol``s: what the collector, the learner and a row slot use
of a stack of networks (:class:`~klppo.rl.engine.numpy_stack.NumpyStack`,
:class:`~klppo.rl.engine.torch_stack.TorchStack`), and what a :class:`~klppo.rl.engine.group.Group`
uses of its members (a single-agent or a multi-agent trainer). mypy checks every call across
them; nothing here runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

if TYPE_CHECKING:
    from klppo.core.loss import PPOLoss
    from klppo.nn.actor_critic import ActorCritic
    from klppo.nn.step import StepResult
    from klppo.rl.config import PPOConfig, TrainConfig
    from klppo.rl.engine.rows import Layout, Minibatch, RowSlot

__all__ = ["RowAdam", "Stack", "GroupMember"]


class RowAdam(Protocol):
    """Adam over the rows of a stack, each row its own learning rate and state."""

    def set_lr(self, r: int, lr: float) -> None: ...

    def row_state(self, r: int) -> dict[str, Any]: ...

    def load_row(self, r: int, s: dict[str, Any]) -> None: ...


class Stack(Protocol):
    """R networks of one shape, one row each: what a row slot, the collector and the learner
    call. ``fast``: the numpy stack (its rows act through the stack's own forward)."""

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
             ws: Any) -> list[StepResult]: ...

    def policy_kl(self, rows: np.ndarray, obs: np.ndarray, old_params: np.ndarray,
                  ws: Any) -> list[float]: ...

    def log_prob(self, row: int, obs: np.ndarray, actions: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]: ...

    def act(self, obs: np.ndarray) -> tuple[Any, Any]: ...


class GroupMember(Protocol):
    """A trainer that iterates in a group: a single-agent run (``lockstep``: its rows act with
    the stack's) or a multi-agent one (not lockstep: it has its own ``collect(iteration)``)."""

    cfg: TrainConfig
    env: Any
    collector: Any
    group: Any
    group_index: int
    iteration: int
    global_step: int

    @property
    def num_iterations(self) -> int: ...

    @property
    def lockstep(self) -> bool: ...

    @property
    def policy_units(self) -> list[Any]: ...

    def start_iteration(self, it: int) -> Any: ...

    def rollouts(self, episodes: Any) -> list[tuple[str, Any, Any]]: ...

    def iteration_metrics(self, it: int, episodes: Any, reports: dict[str, dict[str, Any]],
                          lr: Any) -> dict[str, Any]: ...

    def close(self) -> None: ...
