"""The KLip-PPO reference settings as named presets (``klppo train --preset NAME``).

``klip/<task>`` are the paper's settings (docs/algorithms.md section 5); the MuJoCo tasks run
the paper's v4 environments, and ``klip/<task>-v5`` the same settings on v5. ``marl/*`` run
MPE's simple_adversary as RLlib's multi-agent PPO would.
"""

from __future__ import annotations

from typing import Any

from klppo.rl.config import (
    ConfigError,
    KLConfig,
    MarlConfig,
    NetConfig,
    PPOConfig,
    RolloutConfig,
    TrainConfig,
)

__all__ = ["PRESETS", "MUJOCO_TASKS", "preset"]


def _klip(env: str, envs: int, steps: int, total: int, gamma: float, lam: float, ent: float,
          norm: bool) -> TrainConfig:
    return TrainConfig(
        env=env,
        total_steps=total,
        rollout=RolloutConfig(num_envs=envs, num_steps=steps, norm_obs=norm, norm_reward=norm),
        ppo=PPOConfig(gamma=gamma, gae_lambda=lam, ent_coef=ent, update_epochs=10,
                      minibatch_size=64, kl_estimator="analytic"),
        kl=KLConfig(controller="fixed", beta=1.0, preset="klip", cadence="iteration",
                    measure="rollout"),
    )


def _marl_adversary(continuous: bool) -> TrainConfig:
    """MPE simple_adversary as RLlib's multi-agent PPO would run it: the adversary and the good
    agents are two policies, each with its own RLlib KL coefficient (step rule, target 0.01)."""
    kwargs = ("max_cycles=25",) + (("continuous_actions=true",) if continuous else ())
    return TrainConfig(
        env="pettingzoo:mpe2.simple_adversary_v3",
        objective="clip_kl",
        total_steps=300_000,
        rollout=RolloutConfig(num_envs=8, num_steps=100),
        ppo=PPOConfig(lr=5e-4, gamma=0.99, gae_lambda=0.95, ent_coef=0.01, update_epochs=10,
                      minibatch_size=200),
        kl=KLConfig(controller="step", preset="rllib"),
        net=NetConfig(log_std_init=-0.5 if continuous else 0.0),
        marl=MarlConfig(policies=("adversary=adversary_*", "agent=agent_*"), env_kwargs=kwargs),
    )


#: The KLip-PPO MuJoCo tasks. ``klip/<task>`` runs the paper's v4 environment; ``klip/<task>-v5``
#: the same settings on v5 (other observations: Ant-v5 105 dimensions against v4's 27 with its
#: contact forces, Humanoid-v5 348 against 376; see docs/algorithms.md).
MUJOCO_TASKS = ("HalfCheetah", "Hopper", "Walker2d", "Ant", "Humanoid")

#: Preset name -> config factory (the KLip-PPO reference settings). ``--kl.controller step``
#: with a klip preset uses the klip step rule (target 0.02, beta0 1, beta in [1e-4, 1e4]).
PRESETS: dict[str, Any] = {
    "klip/cartpole": lambda: _klip("CartPole-v1", 4, 128, 100_000, 0.99, 0.95, 0.0, False),
    "klip/lunarlander": lambda: _klip("LunarLander-v3", 16, 1024, 1_000_000, 0.999, 0.98, 0.01,
                                      False),
    **{  # the paper's MuJoCo tasks are v4; the same settings on v5 are klip/<task>-v5
        f"klip/{name.lower()}{suffix}": (
            lambda n=name, v=version: _klip(f"{n}-{v}", 1, 2048, 1_000_000, 0.99, 0.95, 0.0, True))
        for name in MUJOCO_TASKS for suffix, version in (("", "v4"), ("-v5", "v5"))
    },
    "marl/simple_adversary": lambda: _marl_adversary(continuous=False),
    "marl/simple_adversary_continuous": lambda: _marl_adversary(continuous=True),
}


def preset(name: str) -> TrainConfig:
    """A fresh config for a named preset."""
    try:
        return PRESETS[name]()
    except KeyError:
        raise ConfigError(f"preset={name!r}: unknown; choose one of {sorted(PRESETS)}") from None
