"""A single-agent run's trainer: one vector env, one collector and one policy whose network is
a row of its group's stack (:mod:`klppo.rl.engine`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from klppo.rl.config import TrainConfig
from klppo.rl.config_checks import validate
from klppo.rl.engine.group import Group
from klppo.rl.engine.groups import StackSet
from klppo.rl.envs import env_state, make_vector_env, restore_env_state
from klppo.rl.eval_during import Evaluator
from klppo.rl.lifecycle import RunTrainer
from klppo.rl.monitor import ExplosionMonitor
from klppo.rl.rollout import Collector
from klppo.rl.unit import PolicyUnit, episode_means

__all__ = ["SingleTrainer", "MakeStep", "Makers"]

#: builds a policy's row of its stack from its network and loss
MakeStep = Callable[[Any, Any], Any]
#: a run's makers: its policy's name and config -> the policy's MakeStep
Makers = Callable[[str, TrainConfig], MakeStep]


class SingleTrainer(RunTrainer):
    """A single-agent run: one vector env, one collector, one :class:`PolicyUnit` whose network
    is a row of a stack (``make_step``: its :class:`~klppo.rl.engine.StackSet` maker). Its
    iterations are its engine group's (:class:`~klppo.rl.engine.Group`), which collects it in lock
    step with the other single-agent runs of its stack."""

    lockstep = True

    def __init__(self, cfg: TrainConfig, run_dir: Path, make_step: MakeStep) -> None:
        self.cfg = validate(cfg)
        self.run_dir = run_dir
        torch.manual_seed(cfg.seed)
        self.env = make_vector_env(cfg.env, cfg.rollout.num_envs, cfg.seed,
                                   cfg.rollout.vectorization, cfg.env_kwargs,
                                   cfg.rollout.env_backend)
        obs_dim = int(np.prod(self.env.single_observation_space.shape))
        self.unit = u = PolicyUnit(cfg, obs_dim, self.env.single_action_space,
                                   cfg.rollout.num_envs, cfg.seed + 2, make_step=make_step)
        self.agent, self.learner, self.controller = u.agent, u.learner, u.controller
        self.collector = Collector(self.env, u.agent, cfg.rollout.num_steps, cfg.seed + 1,
                                   u.obs_norm, u.rew_scale, u.weights)
        self.monitor = ExplosionMonitor()
        self.evaluator = (Evaluator(cfg, run_dir, self.env.single_observation_space,
                                    self.env.single_action_space) if cfg.eval_every else None)
        self.iteration = 0
        self.global_step = 0
        #: the torch RNG state this run's own process would hold (runs share a process): what
        #: its checkpoint saves
        self.own_torch_rng = torch.get_rng_state()

    @classmethod
    def alone(cls, cfg: TrainConfig, run_dir: Path) -> SingleTrainer:
        """The trainer of a run alone (a group of one), outside any run-directory lifecycle."""
        stacks = StackSet.of([cfg])
        tr = cls(cfg, run_dir, stacks.maker(0, "", cfg))
        Group([tr])
        return tr

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {
            "iteration": self.iteration,
            "global_step": self.global_step,
            **self.unit.state_dict(),
            "collector": self.collector.state_dict(),
            "torch_rng": self.own_torch_rng,
            "env": env_state(self.env),
            **(self.evaluator.state_dict() if self.evaluator is not None else {}),
        }

    def load_state_dict(self, s: dict[str, Any]) -> list[str]:
        """Restore everything; return the problems of the environment restore (empty: exact)."""
        self.iteration, self.global_step = int(s["iteration"]), int(s["global_step"])
        self.unit.load_state_dict(s)
        self.collector.load_state_dict(s["collector"])
        torch.set_rng_state(s["torch_rng"])
        self.own_torch_rng = torch.get_rng_state()
        if self.evaluator is not None:
            self.evaluator.load_state_dict(s)
        problems = list(restore_env_state(self.env, s.get("env"), self.cfg.env))
        if problems:  # the env could not be restored: start new episodes, deterministically
            self.collector.reset(self.cfg.seed + self.iteration)
        return problems

    def start(self) -> None:
        """First episodes of a new run."""
        self.collector.reset(self.cfg.seed)

    def describe(self, m: dict[str, Any]) -> str:
        """A short summary of one iteration's metrics (for the log)."""
        text = (f"step {self.global_step} return {m['episode_return_mean']} "
                f"kl {m['kl_rollout']:.4g}")
        if "eval_return_mean" in m:
            text += f" eval {m['eval_return_mean']:.4g}"
        return text

    # ---------------------------------------------------------------- what the group asks
    def start_iteration(self, it: int) -> float:
        """Set iteration ``it``'s learning rate; return it."""
        return self.unit.start_iteration(it)

    @property
    def policy_units(self) -> list[PolicyUnit]:
        """The run's policies (one)."""
        return [self.unit]

    def rollouts(self, episodes: Any) -> list[tuple[str, PolicyUnit, Any]]:
        """The policy and the buffer it learns from after a rollout."""
        return [("", self.unit, self.collector.buf)]

    def iteration_metrics(self, it: int, episodes: Any, reports: dict[str, dict[str, Any]],
                          lr: float) -> dict[str, Any]:
        """One iteration's metrics from its episodes and the policy's report."""
        m = {"iteration": it, "global_step": self.global_step,
             **episode_means(episodes.returns, episodes.lengths), "lr": lr, **reports[""]}
        if self.evaluator is not None and self.evaluator.due(it, self.num_iterations):
            m.update(self.evaluator.evaluate(it, self.unit.state_dict()))
        return m
