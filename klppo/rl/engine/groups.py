"""Which policies share a stack, and which runs can share a group.

Every policy of every run is a row of a stack; a stack holds networks of one shape that step
together, so its key (:class:`StackKey`) is what shapes the computation: the observation size
and action head that the run's env actually makes (not the settings that usually decide them),
the hidden layers and trunk, the step's array library (numpy where the fast path serves the
policy, else torch) and device, and the update's batch, minibatch and epoch counts. Everything
else (objective, controller, actuators, band controller, cadence, early stops, learning rate and
schedule, normalisation, seeds, length of the run, W&B and TensorBoard) may differ from row to
row. Runs whose policies fall into the same stacks, with one rollout length, env backend and
number of torch and EnvPool threads, can share a group (:func:`group_key`): a sweep trains each
group in one process.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gymnasium import spaces

from klppo.core.loss import PPOLoss
from klppo.nn.actor_critic import ActorCritic
from klppo.rl.config import TrainConfig, from_dict, to_dict
from klppo.rl.engine.numpy_stack import NumpyStack
from klppo.rl.engine.torch_stack import TorchStack
from klppo.rl.envs import env_spaces
from klppo.rl.marl.spec import check_multiagent, is_multiagent
from klppo.rl.update import make_loss
from klppo.runs.device import resolve_device
from klppo.runs.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = ["StackKey", "StackSet", "stack_keys", "library_of", "group_key", "check_group",
           "device_refusal"]

MakeStep = Callable[[ActorCritic, PPOLoss], Any]


@dataclass(frozen=True)
class StackKey:
    """What the rows of one stack share (see the module docstring)."""

    obs_dim: int
    head: tuple[str, int]
    hidden: tuple[int, ...]
    shared_trunk: bool
    separate_losses: bool
    library: str
    device: str
    batch: int
    minibatch: int
    epochs: int


def library_of(cfg: TrainConfig) -> tuple[str, str | None]:
    """``("numpy", None)`` when the numpy fast path serves the policy of ``cfg`` exactly, else
    ``("torch", why)``: ``fast_path`` off, a shared trunk, an objective without a closed-form
    derivative or a per-sample band (``why`` None when the fast path was not asked for)."""
    if not cfg.fast_path:
        return "torch", None
    if cfg.net.shared_trunk:
        return "torch", "the network is not two separate Linear/Tanh MLPs (a shared trunk)"
    policy = make_loss(cfg).policy
    if not policy.has_closed_form:
        return "torch", (f"objective {cfg.objective!r} has no closed-form derivative "
                         f"(klppo.core.objectives.Objective.closed_form)")
    if not policy.band.is_scalar:
        return "torch", "per-sample (tensor) clip bands are not supported by the fast path"
    return "numpy", None


def _head(action_space: Any) -> tuple[str, int]:
    if isinstance(action_space, spaces.Discrete):
        return "categorical", int(action_space.n)
    return "gaussian", int(math.prod(action_space.shape))


def _key(cfg: TrainConfig, obs_space: Any, action_space: Any, columns: int) -> StackKey:
    library, _ = library_of(cfg)
    device: str = "cpu" if library == "numpy" else cfg.device
    if device_refusal(cfg) is None and library == "torch":
        device = str(resolve_device(cfg.device))  # (else check_group names the device)
    n, p = cfg.net, cfg.ppo
    return StackKey(int(math.prod(obs_space.shape)), _head(action_space), tuple(n.hidden),
                    n.shared_trunk, n.shared_trunk and n.separate_losses, library, device,
                    columns * cfg.rollout.num_steps, p.minibatch_size, p.update_epochs)


@functools.lru_cache(maxsize=256)
def _spaces(env: str, kwargs_json: str) -> tuple[Any, Any]:
    """:func:`~klppo.rl.envs.env_spaces`, made once per env and kwargs (a sweep asks for the
    same ones many times)."""
    return env_spaces(env, json.loads(kwargs_json))


@functools.lru_cache(maxsize=64)
def _multiagent_keys(cfg_json: str) -> tuple[tuple[str, StackKey], ...]:
    cfg = from_dict(json.loads(cfg_json))
    spec = check_multiagent(cfg)
    return tuple((p, _key(spec.configs[p], spec.obs_spaces[p], spec.action_spaces[p],
                          cfg.rollout.num_envs * len(agents)))
                 for p, agents in spec.policies.items())


def stack_keys(cfg: TrainConfig) -> list[tuple[str, StackKey]]:
    """Per policy of the run (``""`` for a single-agent run's one policy), its stack key, from
    the spaces its env makes (made once per env and kwargs, then closed)."""
    if is_multiagent(cfg.env):
        d = to_dict(cfg)
        d.pop("seed"), d.pop("out")  # neither changes a space
        return list(_multiagent_keys(json.dumps(d, sort_keys=True)))
    obs_space, action_space = _spaces(cfg.env, json.dumps(cfg.env_kwargs, sort_keys=True,
                                                          default=repr))
    return [("", _key(cfg, obs_space, action_space, cfg.rollout.num_envs))]


def _say_library(cfg: TrainConfig, key: StackKey, name: str) -> None:
    """Log what the run's ordinary use of the fast path and device comes to (once per row)."""
    who = f"policy {name}: " if name else ""
    _, why = library_of(cfg)
    if why is not None:
        log.warning("%snumpy fast path off: %s; rolling out and updating with torch", who, why)
    elif key.library == "numpy" and resolve_device(cfg.device).type != "cpu":
        log.warning("%sdevice %s: the numpy fast path runs on the CPU; add --no-fast-path to "
                    "train on %s with torch", who, cfg.device, cfg.device)


class StackSet:
    """The stacks of a group and each policy's row in them: ``plan[i]`` lists member ``i``'s
    policies and their stack keys (:func:`stack_keys`); :meth:`maker` is what a member's
    policy joins its row with."""

    def __init__(self, plan: list[list[tuple[str, StackKey]]]) -> None:
        counts = Counter(k for member in plan for _, k in member)
        self.stacks = {k: NumpyStack(n) if k.library == "numpy" else TorchStack(n, k.device)
                       for k, n in counts.items()}
        used: Counter[StackKey] = Counter()
        self.rows: list[dict[str, tuple[StackKey, int]]] = []
        for member in plan:
            mine = {}
            for name, k in member:
                mine[name] = (k, used[k])
                used[k] += 1
            self.rows.append(mine)

    def maker(self, member: int, name: str, cfg: TrainConfig) -> MakeStep:
        """The ``make_step`` of member ``member``'s policy ``name`` (its config ``cfg``)."""
        if name not in self.rows[member]:
            raise ValueError(f"policy {name!r} was not planned for this group")
        key, row = self.rows[member][name]
        _say_library(cfg, key, name)
        return self.stacks[key].maker(row, cfg.ppo)

    @classmethod
    def of(cls, configs: list[TrainConfig]) -> StackSet:
        return cls([stack_keys(c) for c in configs])


def device_refusal(cfg: TrainConfig) -> str | None:
    """A device that does not resolve here (cuda without a GPU, an unknown name)."""
    try:
        resolve_device(cfg.device)
    except ValueError as e:
        return str(e)
    return None


def group_key(cfg: TrainConfig, keys: list[tuple[str, StackKey]] | None = None
              ) -> tuple[Any, ...]:
    """Runs with equal keys can share a group (see the module docstring); ``keys`` are the
    run's :func:`stack_keys` when known."""
    keys = stack_keys(cfg) if keys is None else keys
    r = cfg.rollout
    return (tuple(sorted({k for _, k in keys}, key=repr)), r.num_steps, r.env_backend,
            cfg.torch_threads, cfg.envpool_threads, is_multiagent(cfg.env))


_FIELDS = ("stacks (spaces, network, step library and device, batch, minibatch and epochs)",
           "rollout.num_steps", "rollout.env_backend", "torch_threads", "envpool_threads",
           "multi-agent")


def check_group(configs: list[TrainConfig], where: list[str],
                plan: list[list[tuple[str, StackKey]]] | None = None) -> None:
    """One-line :class:`ConfigError` naming the first run (``where``) that cannot share a group
    with the first one, or whose device does not resolve here."""
    plan = [stack_keys(c) for c in configs] if plan is None else plan
    first = group_key(configs[0], plan[0])
    for cfg, keys, name in zip(configs, plan, where):
        why = device_refusal(cfg)
        if why is not None:
            raise ConfigError(f"{name}: {why}")
        mine = group_key(cfg, keys)
        if mine != first:
            diff = [f for f, a, b in zip(_FIELDS, mine, first) if a != b]
            raise ConfigError(f"{name}: cannot share a process with {where[0]}: they differ in "
                              f"{', '.join(diff)}")
