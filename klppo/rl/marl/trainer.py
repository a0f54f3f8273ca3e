"""The multi-agent trainer: one env loop, one :class:`~klppo.rl.unit.PolicyUnit` per policy.

It has the single-agent trainer's interface (``iterate``, ``state_dict``, ``start``, ...), so
:func:`klppo.rl.trainer.train` and :func:`~klppo.rl.trainer.resume` run it with the same run
directory, checkpoints, exact resume, failure handling and metrics sinks. Per iteration: every
policy collects over the shared env loop, then each learns from its own rollout with its own
objective and controller. Metrics carry the policy id as prefix (``adversary/beta``,
``agent/episode_return_mean``); ``global_step`` counts environment steps (each step of an env
copy once, whatever the number of agents).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from klppo.rl.config import TrainConfig, validate
from klppo.rl.lifecycle import RunTrainer
from klppo.rl.marl.collect import MultiCollector
from klppo.rl.marl.env import ParallelVecEnv
from klppo.rl.marl.spec import check_multiagent, make_parallel_env
from klppo.rl.monitor import PerPolicyMonitor
from klppo.rl.unit import PolicyUnit, episode_means

__all__ = ["MultiTrainer"]


class MultiTrainer(RunTrainer):
    """A multi-agent run: one PettingZoo vector env, one :class:`PolicyUnit` per policy."""

    def __init__(self, cfg: TrainConfig, run_dir: Path) -> None:
        self.cfg = validate(cfg)
        self.run_dir = run_dir
        self.spec = spec = check_multiagent(cfg)
        torch.manual_seed(cfg.seed)
        self.env = ParallelVecEnv(lambda: make_parallel_env(cfg), cfg.rollout.num_envs,
                                  spec.policies, cfg.seed, name=cfg.env)
        self.units = {
            p: PolicyUnit(spec.configs[p], int(np.prod(spec.obs_spaces[p].shape)),
                          spec.action_spaces[p], self.env.columns(p), cfg.seed + 2 + 7919 * k,
                          name=p)
            for k, p in enumerate(spec.policies)
        }
        self.collector = MultiCollector(self.env, self.units, spec.action_spaces,
                                        cfg.rollout.num_steps, cfg.seed)
        self.monitor = PerPolicyMonitor(list(self.units))
        self.iteration = 0
        self.global_step = 0

    @property
    def policies(self) -> list[str]:
        return list(self.units)

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {
            "iteration": self.iteration,
            "global_step": self.global_step,
            "policies": {p: u.state_dict() for p, u in self.units.items()},
            "collector": self.collector.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "env": self.env.state_dict(),
        }

    def load_state_dict(self, s: dict[str, Any]) -> list[str]:
        """Restore everything; return the problems of the environment restore (empty: exact)."""
        self.iteration, self.global_step = int(s["iteration"]), int(s["global_step"])
        for p, u in self.units.items():
            u.load_state_dict(s["policies"][p])
        self.collector.load_state_dict(s["collector"])
        torch.set_rng_state(s["torch_rng"])
        problems = list(self.env.load_state_dict(s["env"]))
        if problems:  # new episodes, from the episode counters: deterministic
            self.collector.reset()
        return problems

    def start(self) -> None:
        self.collector.reset()

    # ---------------------------------------------------------------- phases
    def phases(self) -> dict[str, Any]:
        cfg = self.cfg
        it = self.iteration + 1
        lrs = {p: u.start_iteration(it) for p, u in self.units.items()}
        t0 = time.perf_counter()
        stats, lengths = self.collector.collect(it)                            # 1. collect
        self.global_step += cfg.batch_size
        t1 = time.perf_counter()
        m: dict[str, Any] = {"iteration": it, "global_step": self.global_step,
                             "episode_length_mean": float(np.mean(lengths)) if lengths else None,
                             "episode_count": len(lengths)}
        for p, u in self.units.items():                                        # 2-4. learn
            ep = episode_means(stats[p].returns, [])
            policy = {"episode_return_mean": ep["episode_return_mean"], "lr": lrs[p],
                      **u.learn(self.collector.slots[p].buf, it)}
            m.update({f"{p}/{k}": v for k, v in policy.items()})
        t2 = time.perf_counter()
        self.iteration = it
        m.update(time_collect=t1 - t0, time_update=t2 - t1)                    # 5. log
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

