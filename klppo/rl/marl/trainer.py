"""The multi-agent trainer: one env loop, one :class:`~klppo.rl.unit.PolicyUnit` per policy.

It has the single-agent trainer's interface (``iterate``, ``state_dict``, ``start``, ...), so
:func:`klppo.rl.trainer.train` and :func:`~klppo.rl.trainer.resume` run it with the same run
directory, checkpoints, exact resume, failure handling and metrics sinks. Each policy's network
is a row of a stack of its engine group (``makers``), and the group computes its iterations
(:class:`klppo.rl.engine.Group`): every policy collects over the shared env loop, then each learns
from its own rollout with its own objective and controller, its update stepped together with the
other rows of its stack. Metrics carry the policy id as prefix (``adversary/beta``,
``agent/episode_return_mean``); ``global_step`` counts environment steps (each step of an env
copy once, whatever the number of agents).
"""

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
from klppo.rl.lifecycle import RunTrainer
from klppo.rl.marl.collect import MultiCollector
from klppo.rl.marl.env import ParallelVecEnv
from klppo.rl.marl.spec import check_multiagent, make_parallel_env
from klppo.rl.monitor import PerPolicyMonitor
from klppo.rl.unit import PolicyUnit, episode_means

__all__ = ["MultiTrainer"]


class MultiTrainer(RunTrainer):
    """A multi-agent run: one PettingZoo vector env, one :class:`PolicyUnit` per policy."""

    lockstep = False

    def __init__(self, cfg: TrainConfig, run_dir: Path,
                 makers: Callable[[str, TrainConfig], Any]) -> None:
        self.cfg = validate(cfg)
        self.run_dir = run_dir
        self.spec = spec = check_multiagent(cfg)
        torch.manual_seed(cfg.seed)
        self.env = ParallelVecEnv(lambda: make_parallel_env(cfg), cfg.rollout.num_envs,
                                  spec.policies, cfg.seed, name=cfg.env)
        self.units = {
            p: PolicyUnit(spec.configs[p], int(np.prod(spec.obs_spaces[p].shape)),
                          spec.action_spaces[p], self.env.columns(p), cfg.seed + 2 + 7919 * k,
                          name=p, make_step=makers(p, spec.configs[p]))
            for k, p in enumerate(spec.policies)
        }
        self.collector = MultiCollector(self.env, self.units, spec.action_spaces,
                                        cfg.rollout.num_steps, cfg.seed)
        self.monitor = PerPolicyMonitor(list(self.units))
        self.iteration = 0
        self.global_step = 0
        self.own_torch_rng = torch.get_rng_state()  # as the single-agent trainer's

    @classmethod
    def alone(cls, cfg: TrainConfig, run_dir: Path) -> MultiTrainer:
        """The trainer of a run alone (a group of one), outside any run-directory lifecycle."""
        stacks = StackSet.of([cfg])
        tr = cls(cfg, run_dir, lambda name, c: stacks.maker(0, name, c))
        Group([tr])
        return tr

    @property
    def policies(self) -> list[str]:
        return list(self.units)

    @property
    def policy_units(self) -> list[PolicyUnit]:
        """The run's policies, in :attr:`policies` order."""
        return list(self.units.values())

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {
            "iteration": self.iteration,
            "global_step": self.global_step,
            "policies": {p: u.state_dict() for p, u in self.units.items()},
            "collector": self.collector.state_dict(),
            "torch_rng": self.own_torch_rng,
            "env": self.env.state_dict(),
        }

    def load_state_dict(self, s: dict[str, Any]) -> list[str]:
        """Restore everything; return the problems of the environment restore (empty: exact)."""
        self.iteration, self.global_step = int(s["iteration"]), int(s["global_step"])
        for p, u in self.units.items():
            u.load_state_dict(s["policies"][p])
        self.collector.load_state_dict(s["collector"])
        torch.set_rng_state(s["torch_rng"])
        self.own_torch_rng = torch.get_rng_state()
        problems = list(self.env.load_state_dict(s["env"]))
        if problems:  # new episodes, from the episode counters: deterministic
            self.collector.reset()
        return problems

    def start(self) -> None:
        self.collector.reset()

    # ---------------------------------------------------------------- what the group asks
    def start_iteration(self, it: int) -> dict[str, float]:
        """Set each policy's learning rate for iteration ``it``; return them."""
        return {p: u.start_iteration(it) for p, u in self.units.items()}

    def collect(self, iteration: int) -> tuple[dict[str, Any], list[int]]:
        """One rollout of every policy over the shared env loop."""
        return self.collector.collect(iteration)

    def rollouts(self, episodes: Any) -> list[tuple[str, PolicyUnit, Any]]:
        """Each policy and the buffer it learns from."""
        return [(p, u, self.collector.slots[p].buf) for p, u in self.units.items()]

    def iteration_metrics(self, it: int, episodes: tuple[dict[str, Any], list[int]],
                          reports: dict[str, dict[str, Any]],
                          lrs: dict[str, float]) -> dict[str, Any]:
        """One iteration's metrics: the episodes' lengths, and per policy (prefixed with its
        name) its return, learning rate and report."""
        stats, lengths = episodes
        m: dict[str, Any] = {"iteration": it, "global_step": self.global_step,
                             "episode_length_mean": float(np.mean(lengths)) if lengths else None,
                             "episode_count": len(lengths)}
        for p in self.units:
            ep = episode_means(stats[p].returns, [])
            policy = {"episode_return_mean": ep["episode_return_mean"], "lr": lrs[p],
                      **reports[p]}
            m.update({f"{p}/{k}": v for k, v in policy.items()})
        return m

    def describe(self, m: dict[str, Any]) -> str:
        """A short per-policy summary of one iteration's metrics (for the log)."""
        parts = []
        for p in self.units:
            ret = m.get(f"{p}/episode_return_mean")
            ret_s = "-" if ret is None else f"{ret:.4g}"
            parts.append(f"{p}: return {ret_s} kl {m[f'{p}/kl_rollout']:.4g} "
                         f"beta {m[f'{p}/beta']:.4g}")
        return "; ".join(parts)

