"""Evaluate the policies of a multi-agent run, each trained or replaced by a random one.

Playing a trained policy against a uniformly random one answers "did it learn?" in a
competitive game, where training returns move with the opponent: the trained adversary against
random good agents, the trained good agents against a random adversary, both trained, both
random. Episodes use seeds ``seed + k``; trained policies act with their frozen normalisation.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from klppo.rl.lifecycle import read_run_config
from klppo.rl.marl.spec import check_multiagent, make_parallel_env
from klppo.rl.policy import Policy, load_policies
from klppo.runs.threads import compute_threads

__all__ = ["PolicyReturns", "evaluate_policies"]


@dataclass
class PolicyReturns:
    """One policy's episode returns (per episode, the mean over its agents)."""

    actor: str  # "trained" or "random"
    returns: list[float]

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns))

    @property
    def std(self) -> float:
        return float(np.std(self.returns))


def _random_action(space: Any, rng: np.random.Generator) -> Any:
    if hasattr(space, "n"):
        return int(rng.integers(space.n))
    return rng.uniform(space.low, space.high).astype(np.float32)


def _episode(env: Any, policies: dict[str, list[str]], trained: dict[str, Policy],
             seed: int, deterministic: bool, rng: np.random.Generator,
             gen: torch.Generator) -> dict[str, float]:
    obs, _ = env.reset(seed=seed)
    total = {a: 0.0 for agents in policies.values() for a in agents}
    while True:
        actions: dict[str, Any] = {}
        for p, agents in policies.items():
            if p in trained:
                acts = trained[p].act(np.stack([obs[a] for a in agents]), deterministic, gen)
                actions.update(zip(agents, acts))
            else:
                actions.update({a: _random_action(env.action_space(a), rng) for a in agents})
        obs, rew, term, trunc, _ = env.step(actions)
        for a in total:
            total[a] += float(rew.get(a, 0.0))
        if all(term.get(a, False) or trunc.get(a, False) for a in total):
            return {p: float(np.mean([total[a] for a in agents]))
                    for p, agents in policies.items()}


@compute_threads(torch_threads=1)  # one small network per step: more threads only contend
def evaluate_policies(run_dir: str | Path, episodes: int = 100, seed: int = 1_000_000,
                      random: Iterable[str] = (), deterministic: bool = False
                      ) -> dict[str, PolicyReturns]:
    """Per policy, its returns over ``episodes`` episodes; the policies in ``random`` act
    uniformly at random (seeded). Sampled actions by default (as in training)."""
    if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1:
        raise ValueError(f"episodes={episodes!r}: must be an integer >= 1")
    cfg = read_run_config(run_dir, "run_dir")
    spec = check_multiagent(cfg)
    random = set(random)
    unknown = random - set(spec.policies)
    if unknown:
        raise ValueError(f"random={sorted(unknown)}: not policies of this run "
                         f"({sorted(spec.policies)})")
    trained = {p: pol for p, pol in load_policies(run_dir).items() if p not in random}
    env = make_parallel_env(cfg)
    rng, gen = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    try:
        eps = [_episode(env, spec.policies, trained, seed + k, deterministic, rng, gen)
               for k in range(episodes)]
    finally:
        env.close()
    return {p: PolicyReturns("trained" if p in trained else "random", [e[p] for e in eps])
            for p in spec.policies}
