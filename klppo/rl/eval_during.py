"""Evaluation during training (``eval_every``), as Stable-Baselines3's ``EvalCallback``.

Every ``eval_every`` iterations and at the last, the policy of that moment (network and the
observation normaliser's statistics, exactly what a checkpoint holds) plays ``eval_episodes``
episodes on an environment of its own with deterministic actions, episode ``k`` seeded
``EVAL_SEED + k``: the definition of ``klppo eval``, so an evaluation logged during training equals
``klppo eval`` of a checkpoint taken at that iteration. Nothing of the training's state is
touched (its torch random state is restored), so a run with evaluations trains exactly as one
without, and a resumed run evaluates as the uninterrupted one.

The best evaluation so far is kept in ``RUN_DIR/best/`` (``checkpoint.pt`` with the network and
normaliser, and the run's ``config.yaml`` and ``spaces.json``): ``klppo.load("RUN_DIR/best")`` and
``klppo eval RUN_DIR/best`` read it. A later evaluation replaces it only when strictly better.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from klppo.rl.config import TrainConfig
from klppo.rl.envs import make_env
from klppo.rl.evaluate import EVAL_SEED, run_episodes
from klppo.rl.policy import policy_from_state
from klppo.runs import checkpoint as ckpt

__all__ = ["Evaluator", "BEST_DIR"]

#: the run's subdirectory holding the best evaluated policy
BEST_DIR = "best"


class Evaluator:
    """Evaluates one run's policy when due and keeps the best (see the module docstring)."""

    def __init__(self, cfg: TrainConfig, run_dir: Path, obs_space: gym.Space,
                 act_space: gym.Space) -> None:
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.obs_space, self.act_space = obs_space, act_space
        self.best: float | None = None  # the best eval_return_mean so far
        self._env: gym.Env | None = None

    def due(self, it: int, last: int) -> bool:
        every = self.cfg.eval_every
        return bool(every) and (it % every == 0 or it == last)

    def evaluate(self, it: int, state: dict[str, Any]) -> dict[str, Any]:
        """Evaluate the policy in ``state`` (a checkpoint's ``agent`` and ``obs_norm``) at
        iteration ``it``; its metrics (``eval_*``); the best kept when it is better."""
        with torch.random.fork_rng(devices=[]):  # building the network draws initial weights
            policy = policy_from_state(self.cfg, state, self.obs_space, self.act_space,
                                       "evaluation")
        if self._env is None:
            self._env = make_env(self.cfg.env, self.cfg.env_kwargs)
        returns, lengths = run_episodes(self._env, policy, self.cfg.eval_episodes, EVAL_SEED)
        mean = float(np.mean(returns))
        improved = self.best is None or mean > self.best
        if improved:
            self.best = mean
            self._keep(it, state, mean)
        return {"eval_return_mean": mean, "eval_return_std": float(np.std(returns)),
                "eval_length_mean": float(np.mean(lengths)), "eval_best": self.best,
                "eval_improved": float(improved)}

    def _keep(self, it: int, state: dict[str, Any], mean: float) -> None:
        best = self.run_dir / BEST_DIR
        best.mkdir(exist_ok=True)
        for name in ("config.yaml", "spaces.json"):
            if (self.run_dir / name).is_file():
                shutil.copyfile(self.run_dir / name, best / name)
        ckpt.save_checkpoint(best, {"iteration": it, "agent": state["agent"],
                                    "obs_norm": state.get("obs_norm"),
                                    "eval_return_mean": mean})

    def state_dict(self) -> dict[str, Any]:
        return {"eval_best": self.best}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        best = s.get("eval_best")
        self.best = None if best is None else float(best)

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None
