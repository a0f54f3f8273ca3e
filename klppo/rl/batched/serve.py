"""Which runs the batched engine serves, and which of them can share one process.

A run is served when its networks are two separate tanh MLPs and nothing in it is per-process:
a single-agent env, no W&B run, the default beta actuator, no clip-bound controller. Its step is
the one its ordinary engine would take (:func:`klppo.rl.backends.make_backend`'s choice): the
numpy stack where the fast path serves it (``fast_path`` on, an objective with a closed-form
derivative, a scalar clip band), else the torch stack on ``device`` (the CPU or a GPU). Runs
share a process when their networks, rollouts and update loops have one shape: the same env id,
number of envs, steps per rollout, minibatch size, update epochs, hidden layers, torch threads,
step (numpy or torch) and device. Everything else (objective, controller, cadence, early stops,
learning rate and its schedule, normalisation, seeds, length of the run) may differ from run to
run.
"""

from __future__ import annotations

from typing import Any

from klppo.rl.config import TrainConfig
from klppo.rl.marl.spec import is_multiagent
from klppo.rl.update import make_loss
from klppo.runs.device import resolve_device
from klppo.runs.errors import ConfigError

__all__ = ["refusal", "device_refusal", "uses_numpy", "group_key", "check_group"]


def uses_numpy(cfg: TrainConfig) -> bool:
    """True when the run's ordinary engine takes the numpy fast path (then so does the batched
    one), False when it trains with torch on ``cfg.device``."""
    policy = make_loss(cfg).policy
    return cfg.fast_path and policy.has_closed_form and policy.band.is_scalar


def refusal(cfg: TrainConfig) -> str | None:
    """Why the batched engine cannot train ``cfg`` (it then trains in the ordinary engine), or
    None when it can."""
    if is_multiagent(cfg.env):
        return "a multi-agent env (the batched engine stacks single-agent runs)"
    if cfg.net.shared_trunk:
        return "net.shared_trunk: the batched step serves two separate tanh MLPs"
    if cfg.track == "wandb":
        return "track=wandb (one W&B run per process)"
    if cfg.kl.actuator != "beta":
        return f"kl.actuator={cfg.kl.actuator!r}: the batched update loop drives beta only"
    if cfg.ppo.band_controller != "none":
        return (f"ppo.band_controller={cfg.ppo.band_controller!r}: the batched update loop keeps "
                f"each run's band fixed")
    return None


def device_refusal(cfg: TrainConfig) -> str | None:
    """A device that does not resolve here (cuda without a GPU, an unknown name)."""
    try:
        resolve_device(cfg.device)
    except ValueError as e:
        return str(e)
    return None


def group_key(cfg: TrainConfig) -> tuple[Any, ...]:
    """Runs with equal keys can be stacked in one process (see the module docstring)."""
    r, p = cfg.rollout, cfg.ppo
    numpy_step = uses_numpy(cfg)
    return (cfg.env, r.num_envs, r.num_steps, p.minibatch_size, p.update_epochs,
            tuple(cfg.net.hidden), cfg.torch_threads, "numpy" if numpy_step else "torch",
            "cpu" if numpy_step else str(resolve_device(cfg.device)))


def check_group(configs: list[TrainConfig], where: list[str]) -> None:
    """One-line :class:`ConfigError` naming the first run (``where``) that cannot be batched
    with the first one, or that the engine cannot serve at all."""
    for cfg, name in zip(configs, where):
        why = device_refusal(cfg) or refusal(cfg)
        if why is not None:
            raise ConfigError(f"{name}: the batched engine cannot train it: {why}")
        if group_key(cfg) != group_key(configs[0]):
            fields = ("env", "rollout.num_envs", "rollout.num_steps", "ppo.minibatch_size",
                      "ppo.update_epochs", "net.hidden", "torch_threads", "step",
                      "device")
            diff = [f"{f}={a!r} (not {b!r})" for f, a, b in
                    zip(fields, group_key(cfg), group_key(configs[0])) if a != b]
            raise ConfigError(f"{name}: cannot share a process with {where[0]}: "
                              f"{', '.join(diff)}")
