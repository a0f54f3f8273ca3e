"""klppo: KL-controlled policy optimisation."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["load", "train", "__version__"]


def load(run_dir: Any, policy: str | None = None) -> Any:
    """The trained policy of a run directory, or of its ``checkpoint.pt``
    (:class:`klppo.rl.policy.Policy`): ``predict(obs, deterministic=False)`` as
    Stable-Baselines3's (a sample unless ``deterministic=True``), ``act(batch)`` (the mode),
    ``config``, ``export(path)`` (``torch.export``, or ONNX for ``*.onnx``). The environment
    need not be installed (the run's ``spaces.json``). A multi-agent run holds one per policy:
    ``policy`` names it. A single-agent run's policy also has ``learn(steps)`` (train the run
    further) and ``save(path)`` (a copy of the run), as :func:`train`'s. See docs/usage.md."""
    from klppo.rl.quick import load as _load

    return _load(run_dir, policy)


def train(env: Any, *, preset: str | None = None, **settings: Any) -> Any:
    """Train a policy and return it (:class:`klppo.rl.policy.Policy`), as Stable-Baselines3's
    ``PPO(...).learn(...)``: ``klppo.train("CartPole-v1", objective="clip",
    total_steps=50_000)``. ``env``: a Gymnasium id, a ``gymnasium.Env`` class or a function
    returning a new environment; settings: any ``klppo train`` field by its name (``lr``,
    ``target``, ``seed``, ``out``) or a section as a mapping (``ppo={"lr": 1e-3}``); ``preset``
    starts from a named preset. The policy has ``predict``, ``save``, ``learn`` (train on) and
    ``export``. See docs/usage.md."""
    from klppo.rl.quick import train as _train

    return _train(env, preset=preset, **settings)
