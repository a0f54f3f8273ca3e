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
import difflib
import itertools
from pathlib import Path
from typing import Any

import gymnasium as gym

from klppo.rl.config import ConfigError, TrainConfig, from_dict
from klppo.rl.policy import Policy
from klppo.rl.policy import load as load_policy
from klppo.rl.presets import preset as named_preset
from klppo.rl.trainer import resume
from klppo.rl.trainer import train as train_config
from klppo.runs.errors import InputError
from klppo.runs.owned import is_run_temp

__all__ = ["train", "load", "env_id", "Model"]

#: numbers the process-local ids (one per env_id call with a class or function from __main__)
_LOCAL_IDS = itertools.count()


def train(env: Any, *, preset: str | None = None, **settings: Any) -> Model:
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


def load(run_dir: Any, policy: str | None = None) -> Model:
    """:func:`klppo.rl.policy.load` as a :class:`Model` (a single-agent run's policy, which can
    also train on and be saved); a multi-agent run's policy as it is."""
    loaded = load_policy(run_dir, policy)
    if loaded.run_dir is None:  # a policy of a multi-agent run
        return loaded  # type: ignore[return-value]
    model = Model.__new__(Model)
    model.__dict__.update(loaded.__dict__)
    return model


class Model(Policy):
    """A single-agent run's :class:`~klppo.rl.policy.Policy` with Stable-Baselines3's
    ``learn`` and ``save``: what :func:`train` and ``klppo.load`` return."""

    def save(self, path: str | Path) -> Path:
        """Copy the run this policy was loaded from into the new directory ``path`` (config,
        checkpoint, metrics, spaces): ``klppo.load(path)`` loads it and :meth:`learn` on that
        copy trains on (Stable-Baselines3's ``save`` / ``load``). ``path`` must not exist."""
        import shutil

        target = Path(path)
        if self.run_dir is None:
            raise InputError("save: this policy was not loaded from a single-agent run directory "
                             "(klppo.load(run_dir))")
        if target.exists():
            raise InputError(f"path={str(path)!r}: already exists; give a new directory")
        if not target.parent.is_dir():
            raise InputError(f"path={str(path)!r}: its directory {str(target.parent)!r} does "
                             f"not exist")
        shutil.copytree(self.run_dir, target, ignore=_not_copied)
        return target

    def learn(self, steps: int, lr_plan: str = "replan") -> Model:
        """Train the run ``steps`` environment steps further (its total becomes the old one plus
        ``steps``; SB3's ``learn(steps, reset_num_timesteps=False)``) and return the policy at its
        new end. ``lr_plan``: how an annealed learning rate goes on (``replan``: as a run
        planned for the new total; ``continue``: on from its last value). The run directory is
        the one this policy was loaded from: :meth:`save` a copy first to keep this one."""
        if self.run_dir is None:
            raise InputError("learn: this policy was not loaded from a single-agent run directory "
                             "(klppo.load(run_dir))")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise InputError(f"steps={steps!r}: must be an integer >= 1")
        resume(self.run_dir, total_steps=self.config.total_steps + steps, lr_plan=lr_plan)
        return load(self.run_dir)


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


def _not_copied(folder: str, names: list[str]) -> set[str]:
    """What a saved copy of a run leaves out: the lock and the temp files of the run's own
    atomic writes (a user's ``policy.tmp`` is copied)."""
    return {n for n in names if n == ".lock" or is_run_temp(n)}


def _sections() -> dict[str, set[str]]:
    """Each nested section of TrainConfig -> its field names."""
    out = {}
    for f in dataclasses.fields(TrainConfig):
        default = getattr(TrainConfig(), f.name)
        if dataclasses.is_dataclass(default):
            out[f.name] = {g.name for g in dataclasses.fields(default)}
    return out


def _unknown(key: str, top: set[str], sections: dict[str, set[str]]) -> str:
    """Why ``key`` is refused: no setting has that name; the nearest names, if any."""
    names = top | {n for ns in sections.values() for n in ns}
    near = difflib.get_close_matches(key, sorted(names), n=3)
    hint = f"did you mean {' or '.join(near)}? " if near else ""
    return f"not a setting of klppo train ({hint}`klppo train --help` lists them)"


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
                   f"{owners[0]}={{{key!r}: ...}}" if owners else _unknown(key, top, sections))
            raise ConfigError(f"{key}={value!r}: {why}")
        out.setdefault(owners[0], {})[key] = value
    return out
