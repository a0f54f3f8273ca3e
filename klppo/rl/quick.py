"""``klppo.train(env, **settings)``: train from Python the way Stable-Baselines3 users do.

``env`` is a Gymnasium id (``"CartPole-v1"``, ``"my_envs:MyEnv-v0"``), a ``gymnasium.Env``
class or a function that returns a new environment; settings are keywords: any field of
:class:`~klppo.rl.config.TrainConfig` (``objective``, ``total_steps``, ``seed``, ``out``) or of
one of its sections named by itself when only one section has it (``lr`` is ``ppo.lr``,
``target`` is ``kl.target``), or a section as a mapping (``ppo={"lr": 1e-3}``). ``preset``
starts from a named preset. The run is a normal run directory (``out``, or one klppo names under
``runs/``); the result is its :class:`~klppo.rl.policy.Policy` with ``predict``, ``save``,
``learn`` (train on) and ``export``.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import gymnasium as gym

from klppo.rl.config import ConfigError, TrainConfig, from_dict
from klppo.rl.policy import Policy, load
from klppo.rl.presets import preset as named_preset
from klppo.rl.trainer import train as train_config

__all__ = ["train", "env_id"]

#: numbers the process-local ids (one per env_id call with a class or function from __main__)
_LOCAL_IDS = itertools.count()


def train(env: Any, *, preset: str | None = None, **settings: Any) -> Policy:
    """Train a policy on ``env`` (see the module's docstring) and return it at the run's end.

    >>> policy = klppo.train("CartPole-v1", objective="clip", total_steps=50_000)
    >>> action, _ = policy.predict(obs, deterministic=True)

    Bad settings raise :class:`~klppo.rl.config.ConfigError` naming the field and the value
    before anything is made; a run that fails raises with its reason (its directory keeps the
    last checkpoint, to resume)."""
    base = named_preset(preset) if preset is not None else TrainConfig()
    cfg = from_dict({**nested(settings), "env": env_id(env)}, base, "klppo.train")
    result = train_config(cfg)
    return load(result.run_dir)


def env_id(env: Any) -> str:
    """The id klppo records for ``env``: an id as given; for a class or a factory defined in an
    importable module ``MODULE:NAME`` (made again by any process that can import it); for one
    defined in ``__main__`` or inside a function, an id registered in this process only (a
    resume or ``klppo eval`` from another process cannot make it: define it in a module)."""
    if isinstance(env, str):
        return env
    if isinstance(env, gym.Env):
        raise ConfigError(f"env={env!r}: an environment instance cannot be made again for each "
                          f"parallel environment, a resume or an evaluation; pass its id "
                          f"('CartPole-v1'), its class, or a function that returns a new one "
                          f"(lambda: MyEnv(...))")
    if not callable(env) or (isinstance(env, type) and not issubclass(env, gym.Env)):
        raise ConfigError(f"env={env!r}: expected a Gymnasium id, a gymnasium.Env class or a "
                          f"function returning an environment")
    module, name = getattr(env, "__module__", None), getattr(env, "__qualname__", "")
    if module and module != "__main__" and name.isidentifier():
        return f"{module}:{name}"
    name = "".join(c for c in getattr(env, "__name__", "env") if c.isalnum() or c in "_.")
    local = f"klppo-local/{name or 'env'}.{next(_LOCAL_IDS)}"
    gym.register(id=local, entry_point=env)
    return local


def _sections() -> dict[str, set[str]]:
    """Each nested section of TrainConfig -> its field names."""
    out = {}
    for f in dataclasses.fields(TrainConfig):
        default = getattr(TrainConfig(), f.name)
        if dataclasses.is_dataclass(default):
            out[f.name] = {g.name for g in dataclasses.fields(default)}
    return out


def nested(settings: dict[str, Any]) -> dict[str, Any]:
    """Keyword settings -> the nested mapping :func:`~klppo.rl.config.from_dict` takes: a
    top-level field or a section (a mapping) as it is, any other name in the one section that
    has it; ConfigError for a name no section or several sections have."""
    top = {f.name for f in dataclasses.fields(TrainConfig)}
    sections = _sections()
    out: dict[str, Any] = {}
    for key, value in settings.items():
        if key in top:
            out[key] = ({**out.get(key, {}), **value}
                        if key in sections and isinstance(value, dict) else value)
            continue
        owners = sorted(s for s, names in sections.items() if key in names)
        if len(owners) != 1:
            why = (f"in several sections ({', '.join(f'{s}.{key}' for s in owners)}): pass "
                   f"{owners[0]}={{{key!r}: ...}}" if owners else
                   "not a setting of klppo train (docs/cli.md lists them)")
            raise ConfigError(f"{key}={value!r}: {why}")
        out.setdefault(owners[0], {})[key] = value
    return out
