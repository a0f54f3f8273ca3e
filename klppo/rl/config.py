"""Training configuration: one nested dataclass, validated in one place, with named presets.

Every field has a one-line docstring: tyro turns it into ``klppo train --help``. Derived sizes
are properties, never written back into the config.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from klppo.core.advantages import NormScope
from klppo.core.controllers import CONTROLLERS, ControllerName, StepPreset
from klppo.core.loss import OBJECTIVES, KLEstimatorChoice, ObjectiveName
from klppo.core.surrogates import SHAPES, SOFT_SHAPES, Shape
from klppo.core.values import ValueLossKind
from klppo.rl import bounds
from klppo.runs.configfile import overlay
from klppo.runs.errors import ConfigError
from klppo.runs.ranges import above, at_least, below, check_ranges, within
from klppo.runs.typecheck import short_repr

Cadence = Literal["minibatch", "epoch", "iteration"]
KLMeasure = Literal["last_minibatch", "epoch_mean", "rollout"]
EarlyStop = Literal["none", "minibatch", "epoch"]


@dataclass
class RolloutConfig:
    """Environment vectorisation and normalisation."""

    num_envs: int = field(default=4, metadata=at_least(1))
    """parallel environments (how they are stepped: vectorization)"""
    num_steps: int = field(default=128, metadata=at_least(1))
    """steps per environment per rollout"""
    vectorization: Literal["auto", "sync", "async"] = "auto"
    """auto: gymnasium.make_vec for CartPole, klppo's sync loop for others; async: a process each"""
    env_backend: Literal["gymnasium", "envpool"] = "gymnasium"
    """envpool: EnvPool's C++ task of the same id (pip install 'klppo[envpool]'; not restorable:
    a resumed run starts new episodes)"""
    norm_obs: bool = False
    """running mean/std observation normalisation (statistics are checkpointed)"""
    norm_reward: bool = False
    """scale rewards by the running std of the discounted return"""
    clip_obs: float = field(default=10.0, metadata=above(0))
    """clip normalised observations to +-clip_obs"""
    clip_reward: float = field(default=10.0, metadata=above(0))
    """clip normalised rewards to +-clip_reward"""


@dataclass
class PPOConfig:
    """The PPO update: objective knobs, optimiser, epochs."""

    eps: float = field(default=0.2, metadata=above(0))
    """clip radius (typical 0.1-0.3); also the band of the per-sample template"""
    eps_low: float | None = field(default=None, metadata=above(0))
    """lower band radius for asymmetric clipping (None: eps)"""
    eps_high: float | None = field(default=None, metadata=above(0))
    """upper band radius for asymmetric clipping (None: eps; DAPO uses 0.28)"""
    dual_clip: float | None = field(default=None, metadata=above(1))
    """dual-clip constant c > 1 for negative advantages (None: off; 3 is usual)"""
    shape: Shape = "clip"
    """beta_t shape of per_sample_kl (klppo.core.surrogates.SHAPES)"""
    softness: float | None = field(default=None, metadata=above(0))
    """softness s of the soft shapes (typical 0.02-0.2)"""
    kl_estimator: KLEstimatorChoice = "analytic"
    """KL of kl_penalty / clip_kl: analytic, k1, k2, k3, abs; k3_flipped, tutorial (not the KL)"""
    gamma: float = field(default=0.99, metadata=within(0, 1))
    """discount factor"""
    gae_lambda: float = field(default=0.95, metadata=within(0, 1))
    """GAE lambda"""
    update_epochs: int = field(default=10, metadata=at_least(1))
    """passes over the rollout per iteration"""
    minibatch_size: int = field(default=64, metadata=at_least(1))
    """samples per minibatch (a power of two makes clip and per_sample_kl bit-identical)"""
    lr: float = field(default=3e-4, metadata=above(0))
    """Adam learning rate"""
    adam_eps: float = field(default=1e-5, metadata=above(0))
    """Adam epsilon"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0, once per iteration"""
    max_grad_norm: float = field(default=0.5, metadata=above(0))
    """global gradient-norm clip"""
    vf_coef: float = field(default=0.5, metadata=at_least(0, integer=False))
    """critic loss weight"""
    value_clip: float | None = field(default=0.2, metadata=above(0))
    """PPO value clipping radius (None: off)"""
    value_loss: ValueLossKind = "l2"
    """critic loss: l2 (0.5 (V-R)^2), l1, smooth_l1"""
    ent_coef: float = field(default=0.0, metadata=at_least(0, integer=False))
    """entropy bonus weight"""
    norm_adv: NormScope = "rollout"
    """advantage normalisation: once per rollout, per minibatch, or none"""
    target_kl: float | None = field(default=None, metadata=above(0))
    """early-stop threshold on the k3 KL(old || new), nats per sample (None: off)"""
    early_stop: EarlyStop = "none"
    """minibatch: skip the step if k3 > 1.5 target_kl (SB3); epoch: stop after it (CleanRL)"""


@dataclass
class KLConfig:
    """The beta controller of kl_penalty and clip_kl (ignored by other objectives)."""

    controller: ControllerName = "fixed"
    """fixed, step, proportional, exponential or pid"""
    beta: float | None = None
    """initial beta (None: the controller's or preset's default)"""
    target: float | None = None
    """target KL in nats per sample (None: the controller's or preset's default)"""
    preset: StepPreset | None = None
    """step-rule preset: ppo_paper, rllib, torchrl, klip"""
    beta_min: float | None = None
    """lower bound on beta"""
    beta_max: float | None = None
    """upper bound on beta"""
    horizon: float | None = None
    """proportional rule horizon, in samples"""
    gain: float | None = None
    """exponential rule gain"""
    kp: float | None = None
    """PID proportional gain"""
    ki: float | None = None
    """PID integral gain"""
    kd: float | None = None
    """PID derivative gain"""
    cadence: Cadence = "iteration"
    """when the controller updates: after every minibatch, epoch, or iteration"""
    monitor_high: float = 2.0
    """KL monitor: warn (log + kl_alarm_high) when the controller's KL stays above this many
    times its target"""
    monitor_low: float = 0.5
    """KL monitor: warn (log + kl_alarm_low) when it stays below this fraction of the target"""
    monitor_patience: int = 3
    """KL monitor: consecutive controller updates before a warning"""
    measure: KLMeasure = "rollout"
    """KL fed to it: last minibatch, epoch mean, or rollout (analytic KL(rollout policy || updated
    policy) over the whole rollout, the KLip baseline; needs cadence iteration)"""

    def controller_options(self) -> dict[str, Any]:
        """Options for ``make_controller``: the fields that are set (``preset`` only for step)."""
        names = ("beta", "target", "beta_min", "beta_max", "horizon", "gain", "kp", "ki", "kd")
        opts = {n: getattr(self, n) for n in names if getattr(self, n) is not None}
        if self.controller == "step" and self.preset is not None:
            opts["preset"] = self.preset
        return opts


@dataclass
class NetConfig:
    """Actor-critic network."""

    hidden: tuple[int, ...] = (64, 64)
    """hidden layer sizes (tanh MLPs)"""
    shared_trunk: bool = False
    """one trunk for policy and value (default: separate networks)"""
    separate_losses: bool = False
    """with a shared trunk, the trunk learns from the policy loss only"""
    log_std_init: float = 0.0
    """initial log-std of Gaussian policies"""


@dataclass
class MarlConfig:
    """Multi-agent runs (env ``pettingzoo:MODULE``): which agents share a policy, and each
    policy's own settings (every objective and controller is available per policy)."""

    policies: tuple[str, ...] = ()
    """policy=agent,agent per policy; a name ending in * matches a prefix, e.g.
    adversary=adversary_* agent=agent_* (default: one policy per agent, named after it)"""
    overrides: tuple[str, ...] = ()
    """per-policy settings policy:field=value over the run's (objective, ppo.*, kl.*, net.*),
    e.g. adversary:kl.target=0.01 agent:objective=clip"""
    env_kwargs: tuple[str, ...] = ()
    """keyword arguments of the module's parallel_env(), key=value (YAML values), e.g.
    continuous_actions=true max_cycles=25"""


@dataclass
class TrainConfig:
    """A PPO training run."""

    env: str = "CartPole-v1"
    """Gymnasium environment id, module:EnvId to import a user's module first, or
    pettingzoo:MODULE for a multi-agent PettingZoo parallel env (MODULE.parallel_env)"""
    objective: ObjectiveName = "clip"
    """clip, per_sample_kl, kl_penalty, unclipped, clip_kl (klppo.core.objectives.OBJECTIVES)"""
    seed: int = field(default=0, metadata=below(2**32, text="must be an integer in [0, 2**32)"))
    """seed of the networks, the environments, action sampling and minibatch order"""
    total_steps: int = field(default=100_000, metadata=at_least(1))
    """environment steps in total (over all parallel environments)"""
    out: str | None = None
    """run directory to create (default: {runs_root}/{env}__{objective}__{seed}__{time})"""
    runs_root: str = "runs"
    """parent directory of default run directories"""
    checkpoint_every: int = field(default=10, metadata=at_least(1))
    """iterations between checkpoints (one is always written at the end)"""
    torch_threads: int = field(default=1, metadata=at_least(1))
    """torch intra-op threads (1 is fastest for small networks)"""
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    """where the torch path runs (auto: cuda when available); the numpy fast path is CPU-only,
    so cuda needs --no-fast-path"""
    track: Literal["none", "wandb"] = "none"
    """also log to Weights & Biases (works with WANDB_MODE=offline)"""
    tensorboard: bool = True
    """write TensorBoard events when the tensorboard package is installed"""
    fast_path: bool = True
    """numpy forward/backward for separate tanh MLPs (same math; off: plain torch autograd)"""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    kl: KLConfig = field(default_factory=KLConfig)
    net: NetConfig = field(default_factory=NetConfig)
    marl: MarlConfig = field(default_factory=MarlConfig)

    @property
    def batch_size(self) -> int:
        """Samples per rollout."""
        return self.rollout.num_envs * self.rollout.num_steps

    @property
    def num_iterations(self) -> int:
        return max(1, self.total_steps // self.batch_size)

    @property
    def num_minibatches(self) -> int:
        return self.batch_size // self.ppo.minibatch_size




def _bad(field_name: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"{field_name}={short_repr(value)}: {why}")


def validate(cfg: TrainConfig) -> TrainConfig:
    """Check every field once, early; raise :class:`ConfigError` naming the field and value."""
    check_ranges(cfg)  # the ranges in the fields' metadata
    bounds.check(cfg)
    _validate_choices(cfg)
    _validate_numbers(cfg)
    _validate_kl(cfg)
    return cfg


def _validate_choices(cfg: TrainConfig) -> None:
    p = cfg.ppo
    if cfg.objective not in OBJECTIVES:
        raise _bad("objective", cfg.objective, f"must be one of {sorted(OBJECTIVES)}")
    if p.shape not in SHAPES:
        raise _bad("ppo.shape", p.shape, f"must be one of {list(SHAPES)}")
    if p.shape in SOFT_SHAPES and p.softness is None:
        raise _bad("ppo.softness", None, f"shape {p.shape!r} needs a softness > 0")
    if cfg.batch_size % p.minibatch_size:
        raise _bad("ppo.minibatch_size", p.minibatch_size,
                   f"must divide the rollout size num_envs * num_steps = {cfg.batch_size}")
    if cfg.total_steps < cfg.batch_size:
        raise _bad("total_steps", cfg.total_steps,
                   f"is less than one rollout (num_envs * num_steps = {cfg.batch_size})")


def _validate_numbers(cfg: TrainConfig) -> None:
    """What a field's own range cannot say: relations between fields."""
    p = cfg.ppo
    if p.early_stop != "none" and p.target_kl is None:
        raise _bad("ppo.early_stop", p.early_stop, "needs ppo.target_kl")
    r = cfg.rollout
    if r.env_backend == "envpool" and (r.vectorization != "auto" or ":" in cfg.env):
        raise _bad("rollout.env_backend", r.env_backend, "runs EnvPool's own tasks, vectorised "
                   "by EnvPool: no rollout.vectorization, no MODULE:ID or pettingzoo env")

def _validate_kl(cfg: TrainConfig) -> None:
    k = cfg.kl
    if k.controller not in CONTROLLERS:
        raise _bad("kl.controller", k.controller, f"must be one of {sorted(CONTROLLERS)}")
    if not (k.monitor_high > 1 and 0 < k.monitor_low < 1 and k.monitor_patience >= 1):
        raise _bad("kl.monitor_high/low/patience", (k.monitor_high, k.monitor_low,
                   k.monitor_patience), "need high > 1, 0 < low < 1 and patience >= 1")
    if k.measure == "rollout" and k.cadence != "iteration":
        raise _bad("kl.measure", k.measure, "the rollout KL exists once per iteration: "
                   "use kl.cadence iteration")
    if k.measure == "epoch_mean" and k.cadence == "minibatch":
        raise _bad("kl.measure", k.measure, "an epoch mean needs kl.cadence epoch or iteration")
    if cfg.net.separate_losses and not cfg.net.shared_trunk:
        raise _bad("net.separate_losses", True, "only applies with net.shared_trunk")
    try:  # the controller validates its own options (names the bad one)
        from klppo.core.controllers import make_controller

        make_controller(k.controller, **k.controller_options())
    except ValueError as e:
        raise ConfigError(f"kl: {e}") from None


def to_dict(cfg: TrainConfig) -> dict[str, Any]:
    d = dataclasses.asdict(cfg)
    d["net"]["hidden"] = list(cfg.net.hidden)
    return d


def from_dict(d: Any, base: TrainConfig | None = None, source: str = "config") -> TrainConfig:
    """Overlay a (possibly partial) nested dict onto ``base``.

    Unknown keys and values of the wrong type (``lr: "fast"``, ``update_epochs: true``,
    ``hidden: 64``) raise :class:`ConfigError` naming the field and the value; ``source`` names
    where the dict came from in the message when it is not a mapping at all.
    """
    cfg = base if base is not None else TrainConfig()
    if not isinstance(d, dict):
        raise ConfigError(f"{source}: must be a mapping of config fields, got "
                          f"{type(d).__name__} {short_repr(d, 60)}")
    try:
        return overlay(cfg, d)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}" if source != "config" else str(e)) from None
