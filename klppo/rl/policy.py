"""A trained policy, ready to use: ``klppo.load(run_dir)`` -> :class:`Policy`.

The policy carries everything acting needs from the run: the network, the action space, the
observation normalisation (frozen at its checkpointed statistics) and the config it was trained
with. ``predict`` follows Stable-Baselines3's signature and default (a sampled action unless
``deterministic=True``); ``act`` takes batches (the mode unless ``deterministic=False``);
``export`` writes a ``torch.export`` program (or ONNX) that maps raw observations to the
deterministic action and gives the same actions as ``act`` (tested). The spaces come from the
run's ``spaces.json`` (:mod:`klppo.rl.spaces`), so loading needs no environment; runs written
before klppo saved it make the environment instead.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, cast

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from klppo.nn.actor_critic import ActorCritic, make_head
from klppo.nn.distributions import CategoricalHead, DiagGaussianHead
from klppo.rl.config import TrainConfig
from klppo.rl.envs import ObsNormalizer, check_env, make_env
from klppo.rl.spaces import SPACES, read_spaces
from klppo.runs import checkpoint as ckpt
from klppo.runs.errors import InputError, RunNotFoundError
from klppo.runs.owned import owned_reason

__all__ = ["Policy", "load", "load_policies", "policy_from_state"]


class Policy:
    """Acts with a trained actor.

    Args:
        agent: the actor-critic (only the actor is used).
        config: the training config of the run.
        action_space: the env's single action space (Box actions are clipped to it).
        obs_norm: the frozen observation normaliser, or None.
        observation_space: the env's single observation space (default: a Box of the
            network's input size); what ``predict`` and ``act`` check observations against.
    """

    def __init__(self, agent: ActorCritic, config: TrainConfig, action_space: gym.Space,
                 obs_norm: ObsNormalizer | None,
                 observation_space: gym.Space | None = None) -> None:
        self.agent, self.config, self.action_space = agent.eval(), config, action_space
        self.obs_norm = obs_norm
        # the first layer: the trunk's, or (without a trunk) the actor MLP's
        first = cast(nn.Sequential, agent.actor if agent.trunk is None else agent.trunk)[0]
        self.obs_dim = int(cast(nn.Linear, first).in_features)
        self.observation_space = observation_space if observation_space is not None else \
            gym.spaces.Box(-np.inf, np.inf, (self.obs_dim,), np.float32)
        self.obs_shape = tuple(self.observation_space.shape or (self.obs_dim,))
        self.discrete = isinstance(agent.head, CategoricalHead)
        self.run_dir: Path | None = None  # the run it was loaded from (load() sets it)

    def _observations(self, obs: Any, name: str, batch: bool | None) -> tuple[np.ndarray, bool]:
        """``obs`` as float32 ``[B, obs_dim]`` and whether it was a single observation;
        InputError (one sentence, naming ``name`` and the shape) for anything that is not one
        observation of the observation space's shape or a batch of them (``batch`` True: only a
        batch; None: either, as SB3's ``predict``)."""
        try:
            x = np.asarray(obs, dtype=np.float32)
        except (TypeError, ValueError) as e:
            raise InputError(f"{name}: cannot be read as numbers ({type(e).__name__}: "
                             f"{str(e)[:80]})") from None
        shape, flat = self.obs_shape, (self.obs_dim,)
        single = x.shape in (shape, flat) and batch is not True
        if not single and not (x.ndim >= 2 and x.shape[1:] in (shape, flat) and x.shape[0] > 0):
            dims = ", ".join(map(str, shape))
            want = f"a batch [B, {dims}]" if batch else (
                f"one observation [{dims}] or a batch [B, {dims}]")
            raise InputError(f"{name}: has shape {list(x.shape)}; the policy takes {want}")
        return x.reshape(-1, self.obs_dim), single

    def normalize(self, obs: np.ndarray) -> np.ndarray:
        """Raw observations ``[B, ...]`` -> the network's float32 input ``[B, obs_dim]``, exactly
        as during training (cast to float32, then the frozen normalisation)."""
        x = np.asarray(obs, dtype=np.float32).reshape(-1, self.obs_dim)
        return self.obs_norm.normalize(x) if self.obs_norm is not None else x

    @torch.no_grad()
    def act(self, obs: np.ndarray, deterministic: bool = True,
            generator: torch.Generator | None = None) -> np.ndarray:
        """Actions for a batch ``[B, ...]`` of raw observations: the mode (argmax or mean) when
        ``deterministic``, else a sample; Box actions clipped to the action space. A batch that
        is not ``[B, *observation shape]`` is refused (InputError, one sentence)."""
        x, _ = self._observations(obs, "obs", batch=True)
        params = self.agent.policy_params(torch.from_numpy(self.normalize(x)))
        head = self.agent.head
        if deterministic:
            chosen = (params.argmax(-1) if self.discrete
                      else cast(DiagGaussianHead, head).split(params)[0])
        else:
            chosen = head.sample(params, generator)
        action: np.ndarray = chosen.numpy()
        if not self.discrete:
            space = cast(gym.spaces.Box, self.action_space)  # a Box: make_head allows no other
            action = np.clip(action, space.low, space.high)
        return action

    def predict(self, observation: np.ndarray, state: Any = None, episode_start: Any = None,
                deterministic: bool = False) -> tuple[np.ndarray, None]:
        """Stable-Baselines3's ``predict(observation, state=None, episode_start=None,
        deterministic=False) -> (action, state)``: one observation or a batch -> ``(action,
        None)`` (a single observation gives a single action; the policies have no recurrent
        state, so ``state`` and ``episode_start`` are ignored and the state returned is None).

        As in SB3, the action is **sampled** from the policy unless ``deterministic=True``
        (then the mode: the argmax, or the Gaussian's mean), with torch's global generator;
        :meth:`act` takes a generator. Box actions are clipped to the action space."""
        obs, single = self._observations(observation, "observation", batch=None)
        action = self.act(obs, deterministic)
        return (action[0] if single else action), None

    def export(self, path: str | Path) -> Path:
        """Save the deterministic policy ``raw obs [B, obs_dim] -> action [B, ...]``
        (normalisation and clipping included, any batch size) to run without klppo.

        ``path`` ending in ``.onnx``: ONNX through ``torch.onnx.export`` (needs ``pip install
        onnx onnxscript``); run it with onnxruntime, input ``obs`` as float32. Any other name:
        a ``torch.export`` program (``.pt2`` by convention); run it with
        ``torch.export.load(path).module()(obs)``. Both give the actions of
        ``act(obs, deterministic=True)`` (tested)."""
        from klppo.rl.export import export_policy

        target = Path(path)
        owned = owned_reason(target, None, "path")
        if owned is not None:  # a run's or sweep's file: never replaced
            raise InputError(owned)
        if target.is_dir():
            raise InputError(f"path={str(path)!r}: a directory; give the file to write")
        if not target.parent.is_dir():
            raise InputError(f"path={str(path)!r}: its directory {str(target.parent)!r} does "
                             f"not exist")
        return export_policy(_Exported(self), self.obs_dim, target)


class _Exported(nn.Module):
    """The deterministic policy as one exportable module (float64 normalisation, as numpy)."""

    # buffers (register_buffer)
    mean: torch.Tensor
    var: torch.Tensor
    low: torch.Tensor
    high: torch.Tensor

    def __init__(self, policy: Policy) -> None:
        super().__init__()
        a = copy.deepcopy(policy.agent).requires_grad_(False)
        self.trunk = a.trunk if a.trunk is not None else nn.Identity()
        self.actor = a.actor
        self.discrete = policy.discrete
        self.act_dim = 0 if policy.discrete else cast(DiagGaussianHead, a.head).dim
        n = policy.obs_norm
        self.normalise = n is not None
        self.register_buffer("mean", torch.as_tensor(n.rms.mean if n else np.zeros(1)).double())
        self.register_buffer("var", torch.as_tensor(n.rms.var if n else np.ones(1)).double())
        self.clip_obs = float(n.clip) if n else 0.0
        space = cast(gym.spaces.Box, policy.action_space)  # read only when not discrete
        low = np.zeros(1) if policy.discrete else space.low
        high = np.zeros(1) if policy.discrete else space.high
        self.register_buffer("low", torch.as_tensor(low, dtype=torch.float32))
        self.register_buffer("high", torch.as_tensor(high, dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.float()
        if self.normalise:
            z = (x.double() - self.mean) / torch.sqrt(self.var + 1e-8)
            x = torch.clamp(z, -self.clip_obs, self.clip_obs).float()
        out = self.actor(self.trunk(x))
        if self.discrete:
            return out.argmax(-1)
        return torch.max(torch.min(out[:, : self.act_dim], self.high), self.low)


def _spaces(run_dir: Path, cfg: TrainConfig) -> tuple[gym.Space, gym.Space]:
    """The run's spaces from its ``spaces.json``; a run written before klppo saved them makes
    its environment (which must then be installed)."""
    saved = read_spaces(run_dir)
    if saved is not None and "observation" in saved:
        if "action" not in saved:
            raise ckpt.CheckpointError(f"{run_dir / SPACES}: has no action space")
        return saved["observation"], saved["action"]
    check_env(cfg.env, cfg.env_kwargs)
    env = make_env(cfg.env, cfg.env_kwargs)
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def _check_spaces(saved: dict, obs_dim: int, act_space: gym.Space, where: Path,
                  source: str, env: str) -> None:
    """CheckpointError naming both ``where`` (the run's ``spaces.json``) and ``source`` (its
    checkpoint) when the spaces the one holds do not fit the other's network: its input size,
    or its action head's. Which of the two is wrong only the env could tell, so both are named."""
    both = (f"{source} and {where} disagree (config.yaml: env {env})")
    hint = "one of them was edited or copied from another run"
    first = saved.get("trunk.0.weight", saved.get("actor.0.weight"))
    takes = getattr(first, "shape", None)
    if takes is not None and len(takes) == 2 and int(takes[1]) != obs_dim:
        raise ckpt.CheckpointError(f"{both}: the observation space has {obs_dim} values but the "
                                   f"checkpoint's network takes {int(takes[1])}; {hint}")
    if isinstance(act_space, gym.spaces.Discrete):
        layers = sorted(k for k in saved if k.startswith("actor.") and k.endswith(".weight"))
        out = getattr(saved.get(layers[-1]) if layers else None, "shape", None)
        if out is not None and len(out) == 2 and int(out[0]) != int(act_space.n):
            raise ckpt.CheckpointError(f"{both}: the action space has {int(act_space.n)} "
                                       f"actions but the checkpoint's network scores "
                                       f"{int(out[0])}; {hint}")
    elif "log_std" not in saved or getattr(saved["log_std"], "shape", None) != \
            (int(np.prod(act_space.shape or (1,))),):
        raise ckpt.CheckpointError(f"{both}: the action space {act_space} does not fit the "
                                   f"checkpoint's network (its Gaussian head); {hint}")


def policy_from_state(cfg: TrainConfig, state: Any, obs_space: gym.Space,
                      act_space: gym.Space, source: str,
                      spaces_file: Path | None = None) -> Policy:
    """A :class:`Policy` from one learner's checkpointed state (network and normaliser);
    :class:`~klppo.runs.checkpoint.CheckpointError` naming ``source`` (the checkpoint) and
    the mismatch when the state does not fit the run's config (another run's checkpoint)."""
    n = cfg.net
    assert obs_space.shape is not None  # a Box or Discrete space (spaces.json, make_head)
    obs_dim = int(np.prod(obs_space.shape))
    agent = ActorCritic(obs_dim, make_head(act_space), n.hidden, n.shared_trunk,
                        n.separate_losses, n.log_std_init)
    if not isinstance(state, dict) or not isinstance(state.get("agent"), dict):
        raise ckpt.CheckpointError(f"{source}: holds no network weights ('agent'); not a "
                                   "klppo train checkpoint")
    fits = f"does not fit the run's config.yaml (env {cfg.env}, net.hidden {list(n.hidden)})"
    if spaces_file is not None:
        _check_spaces(state["agent"], obs_dim, act_space, spaces_file, source, cfg.env)
    load_weights(agent, state["agent"], f"{source}: {fits}")
    obs_norm = None
    if state.get("obs_norm") is not None:
        saved = state["obs_norm"]
        # np.shape(None) is (): a missing mean is reported as its shape
        shape = (np.shape(cast(Any, saved.get("mean"))) if isinstance(saved, dict)
                 else None)
        if shape is None or int(np.prod(shape)) != obs_dim:
            raise ckpt.CheckpointError(f"{source}: {fits}: its observation normaliser has "
                                       f"shape {list(shape or [])}, the env's observations "
                                       f"{obs_dim} values")
        obs_norm = ObsNormalizer(tuple(shape), cfg.rollout.clip_obs)
        try:
            obs_norm.rms.load_state_dict(saved)
        except (KeyError, TypeError, ValueError) as e:
            raise ckpt.CheckpointError(f"{source}: its observation normaliser cannot be read "
                                       f"({type(e).__name__}: {e})") from None
    return Policy(agent, cfg, act_space, obs_norm, obs_space)


def load_weights(agent: nn.Module, saved: Any, where: str) -> None:
    """``agent.load_state_dict(saved)``; CheckpointError ``where``: the first parameter whose
    shape differs (both shapes), or the parameters missing or unexpected."""
    own = agent.state_dict()
    if not isinstance(saved, dict):
        raise ckpt.CheckpointError(f"{where}: the network weights are {type(saved).__name__}, "
                                   f"not a mapping of parameters")
    for k, v in own.items():
        got = getattr(saved.get(k), "shape", None)
        if k in saved and (got is None or tuple(got) != tuple(v.shape)):
            what = list(got) if got is not None else type(saved[k]).__name__
            raise ckpt.CheckpointError(f"{where}: {k} is {what} in the checkpoint, "
                                       f"{list(v.shape)} in the network")
        if k in saved and getattr(saved[k], "dtype", v.dtype) != v.dtype:
            raise ckpt.CheckpointError(f"{where}: {k} is {saved[k].dtype} in the checkpoint, "
                                       f"{v.dtype} in the network (klppo writes what it "
                                       f"trains)")
    missing, extra = sorted(set(own) - set(saved)), sorted(set(saved) - set(own))
    if missing or extra:
        raise ckpt.CheckpointError(f"{where}: parameters missing {missing[:3]}, unexpected "
                                   f"{extra[:3]}")
    try:
        agent.load_state_dict(saved)
    except (RuntimeError, TypeError, ValueError) as e:
        raise ckpt.CheckpointError(f"{where}: {type(e).__name__}: "
                                   f"{str(e).splitlines()[0] if str(e) else ''}") from None


def run_dir_of(path: str | Path) -> Path:
    """The run directory ``path`` names: itself, or the folder of its ``checkpoint.pt``;
    :class:`~klppo.runs.errors.InputError` for another file."""
    p = Path(path)
    if p.is_file() and p.name == ckpt.CHECKPOINT:
        return p.parent
    if p.is_file():
        raise InputError(f"run_dir={str(p)!r}: a file, not a run directory (give the run "
                         f"directory, or its {ckpt.CHECKPOINT})")
    if not p.exists():
        raise RunNotFoundError(f"run_dir={str(p)!r}: no such directory")
    return p


def load(run_dir: str | Path, policy: str | None = None) -> Policy:
    """The policy of a run directory (or of its ``checkpoint.pt``) at its last checkpoint
    (one-line errors for a directory that is not a run or has no readable checkpoint). A
    multi-agent run holds several: ``policy`` names one (:func:`load_policies` gives them
    all). The environment need not be installed (the spaces are read from ``spaces.json``)."""
    from klppo.rl.lifecycle import check_env_module, read_run_config
    from klppo.rl.marl.spec import is_multiagent

    run_dir = run_dir_of(run_dir)
    cfg = read_run_config(run_dir, "run_dir")
    if is_multiagent(cfg.env):
        policies = load_policies(run_dir)
        if policy not in policies:
            raise ValueError(f"{run_dir} is a multi-agent run: policy={policy!r} must be one of "
                             f"{sorted(policies)}")
        return policies[policy]
    if policy is not None:
        raise ValueError(f"policy={policy!r}: {run_dir} is a single-agent run (no policy names)")
    state = _checkpoint(run_dir)
    check_env_module(run_dir, cfg, state)
    obs_space, act_space = _spaces(run_dir, cfg)
    recorded = run_dir / SPACES if (run_dir / SPACES).exists() else None
    pol = policy_from_state(cfg, state, obs_space, act_space, str(run_dir / ckpt.CHECKPOINT),
                            recorded)
    pol.run_dir = run_dir
    return pol


def load_policies(run_dir: str | Path) -> dict[str, Policy]:
    """Every policy of a multi-agent run directory, by name (each with its own config)."""
    from klppo.rl.lifecycle import check_env_module, read_run_config
    from klppo.rl.marl.spec import check_multiagent, is_multiagent, policy_configs

    run_dir = run_dir_of(run_dir)
    cfg = read_run_config(run_dir, "run_dir")
    if not is_multiagent(cfg.env):
        raise ValueError(f"{run_dir} is a single-agent run: use load()")
    state = _checkpoint(run_dir)
    check_env_module(run_dir, cfg, state)
    recorded = read_spaces(run_dir)
    if recorded is not None and "policies" in recorded:
        rec = recorded["policies"]
        configs = policy_configs(cfg, {p: agents for p, (agents, _, _) in rec.items()})
        obs_spaces = {p: o for p, (_, o, _) in rec.items()}
        act_spaces = {p: a for p, (_, _, a) in rec.items()}
    else:  # a run from before spaces.json: the env tells
        spec = check_multiagent(cfg)
        configs, obs_spaces, act_spaces = spec.configs, spec.obs_spaces, spec.action_spaces
    source = str(run_dir / ckpt.CHECKPOINT)
    saved = state.get("policies") if isinstance(state, dict) else None
    if not isinstance(saved, dict) or set(saved) != set(configs):
        have = sorted(saved) if isinstance(saved, dict) else None
        raise ckpt.CheckpointError(f"{source}: holds the policies {have}, the run's "
                                   f"config.yaml {sorted(configs)}")
    return {p: policy_from_state(configs[p], saved[p], obs_spaces[p], act_spaces[p],
                       f"{source} (policy {p})") for p in configs}


def _checkpoint(run_dir: Path) -> Any:
    """The run's checkpoint state; a run without one is named as ``run_dir``."""
    try:
        return ckpt.load_checkpoint(run_dir)
    except FileNotFoundError:
        raise InputError(f"run_dir={str(run_dir)!r}: no {ckpt.CHECKPOINT} yet (the run has "
                         f"not finished an iteration)") from None
