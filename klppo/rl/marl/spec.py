"""What a multi-agent run is made of: its PettingZoo env, its policies and each policy's config.

``env: pettingzoo:MODULE`` names a module with PettingZoo's ``parallel_env(**kwargs)`` (for
example ``pettingzoo:mpe2.simple_adversary_v3``); ``marl.env_kwargs`` are its arguments.
``marl.policies`` maps agents to policies (RLlib's policy mapping): ``adversary=adversary_*``
gives every agent whose name starts with ``adversary_`` one shared policy. ``marl.overrides``
sets one policy's objective, ``ppo.*``, ``kl.*`` or ``net.*`` over the run's own.
Every check here runs before a run directory is made, and fails with one line naming the field.
"""

from __future__ import annotations

import copy
import importlib
from dataclasses import dataclass
from typing import Any

from klppo.rl import config as C
from klppo.rl.config import MULTIAGENT_PREFIX as PREFIX
from klppo.rl.config import is_multiagent
from klppo.rl.config_checks import validate
from klppo.rl.envs import EnvError, space_problem
from klppo.runs.configfile import InputError, merge_nested, parse_yaml
from klppo.runs.install import install_hint

__all__ = ["PREFIX", "is_multiagent", "env_kwargs", "make_parallel_env", "map_policies",
           "policy_configs", "MultiAgentSpec", "check_multiagent"]

#: the sections of a config that may differ between policies
PER_POLICY = ("objective", "ppo", "kl", "net")


def _key_value(item: str, field: str, sep: str = "=") -> tuple[str, str]:
    key, ok, value = str(item).partition(sep)
    if not ok or not key.strip():
        raise C.ConfigError(f"{field}={item!r}: expected key{sep}value")
    return key.strip(), value.strip()


def _yaml_value(text: str, field: str) -> Any:
    try:
        return parse_yaml(text, field) if text else None
    except InputError as e:
        raise C.ConfigError(str(e)) from None


def env_kwargs(cfg: C.TrainConfig) -> dict[str, Any]:
    """``marl.env_kwargs`` as a dict (values read as YAML: ``true``, ``25``, ``0.1``)."""
    out: dict[str, Any] = {}
    for item in cfg.marl.env_kwargs:
        key, value = _key_value(item, "marl.env_kwargs")
        out[key] = _yaml_value(value, f"marl.env_kwargs {key}")
    return out


def make_parallel_env(cfg: C.TrainConfig) -> Any:
    """A new PettingZoo parallel env of ``cfg.env`` (:class:`EnvError` naming why not)."""
    module = cfg.env[len(PREFIX):]
    if not module.strip() or module.startswith("."):
        raise EnvError(f"env={cfg.env!r}: names no module (pettingzoo:MODULE, e.g. "
                       f"pettingzoo:mpe2.simple_adversary_v3)")
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        hint = f" ({install_hint('marl')})" if module.split(".")[0] in ("mpe2", "pettingzoo") \
            else ""
        raise EnvError(f"env={cfg.env!r}: cannot import module {module!r}{hint}: {e}") from None
    if not callable(getattr(mod, "parallel_env", None)):
        raise EnvError(f"env={cfg.env!r}: module {module!r} has no parallel_env() (a PettingZoo "
                       f"parallel API env)")
    kwargs = env_kwargs(cfg)
    try:
        return mod.parallel_env(**kwargs)
    except TypeError as e:
        raise C.ConfigError(f"marl.env_kwargs={list(cfg.marl.env_kwargs)!r}: {e}") from None


def map_policies(patterns: tuple[str, ...], agents: list[str]) -> dict[str, list[str]]:
    """Policy -> its agents (in the env's agent order); every agent in exactly one policy."""
    if not patterns:
        return {a: [a] for a in agents}
    owner: dict[str, str] = {}
    policies: dict[str, list[str]] = {}
    for item in patterns:
        name, names = _key_value(item, "marl.policies")
        if name in policies:
            raise C.ConfigError(f"marl.policies={item!r}: policy {name!r} is named twice")
        if "/" in name or ":" in name:
            raise C.ConfigError(f"marl.policies={item!r}: a policy name cannot hold '/' or ':'")
        wanted = [p.strip() for p in names.split(",") if p.strip()]
        mine = [a for a in agents if any(a.startswith(p[:-1]) if p.endswith("*") else a == p
                                         for p in wanted)]
        if not mine:
            raise C.ConfigError(f"marl.policies={item!r}: matches no agent; the env's agents "
                                f"are {agents}")
        for a in mine:
            if a in owner:
                raise C.ConfigError(f"marl.policies={item!r}: agent {a!r} is already in "
                                    f"policy {owner[a]!r}")
            owner[a] = name
        policies[name] = mine
    missing = [a for a in agents if a not in owner]
    if missing:
        raise C.ConfigError(f"marl.policies={list(patterns)!r}: agents {missing} are in no "
                            f"policy")
    return policies


def _dotted(field: str, value: Any) -> dict[str, Any]:
    d: dict[str, Any] = {}
    node = d
    parts = field.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value
    return d


def policy_configs(cfg: C.TrainConfig, policies: dict[str, list[str]]) -> dict[str, C.TrainConfig]:
    """Each policy's config: the run's, with its ``marl.overrides``, validated, and sized in its
    own samples: ``rollout.num_envs`` = envs x its agents (the columns of its rollout) and
    ``total_steps`` likewise, so its ``num_iterations`` (the learning-rate schedule) is the
    run's."""
    over: dict[str, dict[str, Any]] = {p: {} for p in policies}
    for item in cfg.marl.overrides:
        where, ok, setting = str(item).partition(":")
        if not ok or where.strip() not in policies:
            raise C.ConfigError(f"marl.overrides={item!r}: expected policy:field=value with a "
                                f"policy of {sorted(policies)}")
        field, value = _key_value(setting, "marl.overrides")
        if field.split(".")[0] not in PER_POLICY:
            raise C.ConfigError(f"marl.overrides={item!r}: {field} is not a per-policy field "
                                f"(only {', '.join(PER_POLICY)})")
        d = _dotted(field, _yaml_value(value, f"marl.overrides {item}"))
        over[where.strip()] = merge_nested(over[where.strip()], d)
    out = {}
    for name, agents in policies.items():
        base = copy.deepcopy(cfg)
        base.rollout.num_envs = cfg.rollout.num_envs * len(agents)
        base.total_steps = cfg.total_steps * len(agents)
        try:
            out[name] = validate(C.from_dict(over[name], base))
        except C.ConfigError as e:
            raise C.ConfigError(f"marl.overrides (policy {name}): {e}") from None
        assert out[name].num_iterations == cfg.num_iterations, name
    return out


@dataclass
class MultiAgentSpec:
    """The agents of the env, the policy of each, and the spaces of each policy."""

    agents: list[str]
    policies: dict[str, list[str]]
    configs: dict[str, C.TrainConfig]
    obs_spaces: dict[str, Any]
    action_spaces: dict[str, Any]


def _same_space(env: Any, policy: str, agents: list[str], what: str) -> Any:
    space_of = env.observation_space if what == "observation" else env.action_space
    first = space_of(agents[0])
    for a in agents[1:]:
        if space_of(a) != first:
            raise C.ConfigError(f"marl.policies: policy {policy!r} shares one network between "
                                f"agents with different {what} spaces ({agents[0]}: {first}, "
                                f"{a}: {space_of(a)})")
    return first


def check_multiagent(cfg: C.TrainConfig) -> MultiAgentSpec:
    """Make the env once and check everything a multi-agent run needs (before any directory)."""
    env = make_parallel_env(cfg)
    try:
        agents = list(env.possible_agents)
        policies = map_policies(cfg.marl.policies, agents)
        obs, act = {}, {}
        for p, mine in policies.items():
            obs[p] = _same_space(env, p, mine, "observation")
            act[p] = _same_space(env, p, mine, "action")
            problem = space_problem(obs[p], act[p])
            if problem is not None:
                raise EnvError(f"env={cfg.env!r}: policy {p!r}: {problem}")
    finally:
        env.close()
    if cfg.rollout.vectorization == "async":
        raise C.ConfigError("rollout.vectorization='async': multi-agent runs step their envs in "
                            "this process (use auto or sync)")
    return MultiAgentSpec(agents, policies, policy_configs(cfg, policies), obs, act)
