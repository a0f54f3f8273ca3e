"""Training configuration: one nested dataclass, validated in one place, with named presets.

Every field has a one-line docstring: tyro turns it into ``klppo train --help``. Derived sizes
are properties, never written back into the config.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from tyro.conf import Suppress

from klppo.core.names import (
    ControllerName,
    KLEstimatorChoice,
    MismatchCorrection,
    NormScope,
    ObjectiveName,
    RuleName,
    Shape,
    StepPreset,
    ValueLossKind,
)
from klppo.runs.configfile import overlay
from klppo.runs.errors import ConfigError
from klppo.runs.ranges import Range, above, at_least, below, within
from klppo.runs.typecheck import short_repr

Cadence = Literal["minibatch", "epoch", "iteration"]
KLMeasure = Literal["last_minibatch", "epoch_mean", "rollout"]
EarlyStop = Literal["none", "minibatch", "epoch"]
Actuator = Literal["beta", "lr", "clip"]
BandController = Literal["none", "bapo"]


def _fraction() -> dict[str, Range]:
    """In ``(0, 1]``."""
    return {"range": Range(0, 1, low_open=True, text="must be in (0, 1]")}


def _open_unit(what: str) -> dict[str, Range]:
    """In ``(0, 1)``: a clip radius below the ratio 1 (``1 - eps`` must stay a ratio > 0)."""
    return {"range": Range(0, 1, low_open=True, high_open=True,
                           text=f"must be in (0, 1) ({what})")}


def _between(low: float, high: float, why: str) -> dict[str, Range]:
    """In ``(low, high]``."""
    return {"range": Range(low, high, low_open=True, text=f"must be in ({low:g}, {high:g}] "
                                                         f"({why})")}


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
    """envpool: EnvPool's C++ task of the same id (the envpool extra; not restorable: a resumed
    run starts new episodes)"""
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

    eps: float = field(default=0.2, metadata=_open_unit("the lower edge 1 - eps is a ratio > 0"))
    """clip radius (typical 0.1-0.3); also the band of the per-sample template"""
    eps_low: float | None = field(default=None, metadata=_open_unit("the lower edge 1 - eps_low "
                                                                    "is a ratio > 0"))
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
    """KL of kl_penalty / clip_kl: analytic, k1, k2, k3, abs; k1+, k3+ (verl's: k1's / k3's value,
    k2's gradient); k3_flipped, tutorial (not the KL)"""
    tau_pos: float | None = field(default=None, metadata=_between(0, 100, "beyond, the gate is a "
                                                                  "step that overflows"))
    """sapo: gate temperature where A > 0 (None: the paper's 1.0)"""
    tau_neg: float | None = field(default=None, metadata=_between(0, 100, "beyond, the gate is a "
                                                                  "step that overflows"))
    """sapo: gate temperature where A < 0 (None: the paper's 1.05)"""
    tau: float | None = field(default=None, metadata=above(0))
    """sq_log_ratio: coefficient of (log w)^2 / 2 (None: 1.0)"""
    delta: float | None = field(default=None, metadata=above(0))
    """dppo_tv: probability difference (None: 0.15); dppo_kl: binary KL in nats (None: 0.05)"""
    cov_fraction: float | None = field(default=None, metadata=_fraction())
    """clip_cov / kl_cov: share of a minibatch's samples selected (None: 2e-4 / 2e-3)"""
    cov_low: float | None = None
    """clip_cov: covariance window's lower end (None: 1.0)"""
    cov_high: float | None = None
    """clip_cov: covariance window's upper end (None: 5.0)"""
    kl_cov_coef: float | None = field(default=None, metadata=above(0))
    """kl_cov: coefficient of |log w| on the selected samples (None: 1.0)"""
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
    """entropy bonus weight (with ent_target: the controller's starting value)"""
    ent_target: float | None = None
    """target policy entropy, nats per sample (mean over the rollout's samples): ent_coef is
    then driven after every update by ent_controller towards it (klppo.core.entropy_control;
    None: a constant ent_coef)"""
    ent_controller: ControllerName = "proportional"
    """the rule driving ent_coef (any KL controller rule, fed the entropy mirrored about the
    target), with the rule's own gains and bands"""
    ent_coef_min: float = field(default=1e-5, metadata=above(0))
    """lower bound of the driven ent_coef"""
    ent_coef_max: float = field(default=0.1, metadata=above(0))
    """upper bound of the driven ent_coef"""
    norm_adv: NormScope = "rollout"
    """advantage normalisation: once per rollout, per minibatch, or none"""
    target_kl: float | None = field(default=None, metadata=above(0))
    """early-stop threshold on the k3 KL(old || new), nats per sample (None: off)"""
    early_stop: EarlyStop = "none"
    """minibatch: before every step, stop the update (both loops) when k3 > 1.5 target_kl
    (SB3); epoch: stop after an epoch whose last step had k3 > target_kl (CleanRL)"""
    band_controller: BandController = "none"
    """what moves both clip-band edges before every minibatch step: none, or bapo (BAPO's
    adaptive clipping, arXiv:2510.18927; clip objectives; docs/algorithms.md)"""
    bapo_target: float = 0.4
    """bapo: the positive-advantage share rho_0 of the clip surrogate to reach"""
    bapo_low: tuple[float, float] = (0.6, 0.9)
    """bapo: (start, max) of the lower ratio bound c_low = 1 - eps_low"""
    bapo_high: tuple[float, float] = (1.2, 3.0)
    """bapo: (start, max) of the upper ratio bound c_high = 1 + eps_high"""
    bapo_step_high: float = 0.05
    """bapo: step of c_high (raised first, up to its max)"""
    bapo_step_low: float = 0.02
    """bapo: step of c_low (raised once c_high is at its max)"""
    staleness: int = field(default=0, metadata=within(0, 64))
    """rollouts are collected by the policy this many updates back (an asynchronous actor's
    stale rollouts; 0: the current policy); the ratio, KL and early stop are then taken
    against the proximal policy (the current one before the update) and mismatch_correction
    weights each sample by pi_prox / pi_behaviour"""
    mismatch_correction: MismatchCorrection = "none"
    """with staleness, each sample's weight on the objective from rho = pi_prox / pi_behaviour
    (klppo.core.mismatch): none (1), tis (min(rho, mismatch_upper = 2): decoupled PPO), seq_tis
    (the same of a sequence's ratio; here a sample is a sequence of one), mis (rho, 0 outside
    [mismatch_lower, mismatch_upper] = [none, 2]), icepop (rho, 0 outside [mismatch_lower,
    mismatch_upper] = [0.5, 5]), m2po (rho, but 0 on the samples of largest (log rho)^2 until
    their mean is <= mismatch_upper = 0.04, and above mismatch_reject; pair it with objective
    unclipped)"""
    mismatch_upper: float | None = field(default=None, metadata=above(0))
    """upper bound of mismatch_correction (None: its source's value)"""
    mismatch_lower: float | None = field(default=None, metadata=above(0))
    """icepop: lower bound (None: 0.5); mis: a lower bound makes it two-sided (None: none)"""
    mismatch_reject: float | None = field(default=None, metadata=above(1))
    """m2po: samples whose rho is above it weigh 0 (AReaL's behav_imp_weight_cap; None: off)"""


@dataclass
class KLConfig:
    """The beta controller of kl_penalty and clip_kl (ignored by other objectives)."""

    controller: ControllerName = "fixed"
    """fixed, step, proportional, exponential or pid"""
    beta: float | None = None
    """initial beta (None: the controller's or the preset's own value)"""
    target: float | None = None
    """target KL in nats per sample (None: the controller's or the preset's own value)"""
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

    actuator: Actuator = "beta"
    """what the measured KL drives: beta (the controller above), lr (the learning rate) or clip
    (ppo.eps), the last two every minibatch (docs/algorithms.md)"""
    actuator_rule: RuleName = "rsl_rl"
    """lr / clip actuator's step rule: rsl_rl (KL before each step, applied to it; target 0.01) or
    rl_games (KL of each step, applied from the next; target 0.008)"""
    actuator_min: float | None = field(default=None, metadata=above(0))
    """lower bound of the actuated value (None: lr 1e-5 for rsl_rl, 1e-6 for rl_games; eps 0.02)"""
    actuator_max: float | None = field(default=None, metadata=above(0))
    """upper bound of the actuated value (None: lr 1e-2; eps 0.5)"""

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
    """one trunk for policy and value (off: separate networks)"""
    separate_losses: bool = False
    """with a shared trunk, the trunk learns from the policy loss only"""
    log_std_init: float = field(default=0.0, metadata=within(-20, 10))
    """initial log-std of Gaussian policies, in [-20, 10] (a std of 2e-9 to 2e4)"""


@dataclass
class MarlConfig:
    """Multi-agent runs (env ``pettingzoo:MODULE``): which agents share a policy, and each
    policy's own settings (every objective and controller is available per policy)."""

    policies: tuple[str, ...] = ()
    """policy=agent,agent per policy; a name ending in * matches a prefix, e.g.
    adversary=adversary_* agent=agent_* (empty: one policy per agent, named after it)"""
    overrides: tuple[str, ...] = ()
    """per-policy settings policy:field=value over the run's (objective, ppo.*, kl.*, net.*),
    e.g. adversary:kl.target=0.01 agent:objective=clip"""
    env_kwargs: tuple[str, ...] = ()
    """keyword arguments of the module's parallel_env(), key=value (YAML values), e.g.
    continuous_actions=true max_cycles=25"""


@dataclass
class WandbConfig:
    """Where --track wandb logs (the run's config is the W&B run config)."""

    project: str = "klppo"
    """W&B project"""
    entity: str | None = None
    """W&B entity, a team or a user (None: the logged-in account's)"""
    group: str | None = None
    """W&B group (None; a sweep groups its runs under the sweep directory's name)"""
    tags: tuple[str, ...] = ()
    """W&B tags, e.g. baseline cartpole"""


@dataclass
class TrainConfig:
    """A PPO training run."""

    env: str = "CartPole-v1"
    """Gymnasium environment id, module:EnvId to import a user's module first, or
    pettingzoo:MODULE for a multi-agent PettingZoo parallel env (MODULE.parallel_env)"""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """keyword arguments of gym.make(env, ...) for a single-agent env: a YAML or JSON mapping,
    e.g. --env-kwargs '{continuous: true, gravity: -9.0}' (multi-agent: marl.env_kwargs)"""
    objective: ObjectiveName = "clip"
    """clip, per_sample_kl, kl_penalty, unclipped, clip_kl; cispo, sapo, spo, sq_log_ratio, r2vpo,
    dppo_tv, dppo_kl, clip_cov, kl_cov, topr (each step its own sequence; docs/algorithms.md;
    gspo, gmpo, trm: LM loop only)"""
    seed: int = field(default=0, metadata=below(2**32, text="must be an integer in [0, 2**32)"))
    """seed of the networks, the environments, action sampling and minibatch order"""
    total_steps: int = field(default=100_000, metadata=at_least(1))
    """environment steps in total (over all parallel environments)"""
    out: str | None = None
    """run directory to create (None: {runs_root}/{env}__{objective}__{seed}__{time})"""
    runs_root: str = "runs"
    """parent directory of the run directories named by klppo (when --out is not given)"""
    checkpoint_every: int = field(default=10, metadata=at_least(1))
    """iterations between checkpoints (one is always written at the end)"""
    eval_every: int = field(default=0, metadata=below(10**9, text="must be an integer in "
                                                             "[0, 10**9) (0: no evaluation)"))
    """evaluate the policy every N iterations and at the last (0: never): eval_episodes
    episodes with deterministic actions on their own seeded environment, as klppo eval; logged
    as eval_return_mean, and the best policy kept in best/ (klppo.load(RUN/best))"""
    eval_episodes: int = field(default=10, metadata=below(1001, 1, text="must be an integer "
                                                                  "in [1, 1000]"))
    """episodes per evaluation (eval_every)"""
    torch_threads: int = field(default=1, metadata=at_least(1))
    """torch intra-op threads (1 is fastest for small networks)"""
    envpool_threads: int = field(default=1, metadata=at_least(1))
    """threads EnvPool steps with (rollout.env_backend envpool): a group of runs shares one
    pool, so 2 threads step its physics on 2 cores"""
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    """where the torch path runs (auto: cuda when available); the numpy fast path is CPU-only,
    so cuda needs --no-fast-path"""
    track: Literal["none", "wandb"] = "none"
    """also log to Weights & Biases (works with WANDB_MODE=offline; where: --wandb.*)"""
    tensorboard: bool = True
    """write TensorBoard events when the tensorboard package is installed"""
    metric_names: Literal["klppo", "cleanrl", "sb3"] = "klppo"
    """dashboard names in TensorBoard and W&B: klppo's, or CleanRL's or SB3's where they have
    one, instead (docs/metrics.md); metrics.jsonl always has klppo's keys"""
    fast_path: bool = True
    """numpy forward/backward for separate tanh MLPs (same math; off: plain torch autograd)"""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    kl: KLConfig = field(default_factory=KLConfig)
    net: NetConfig = field(default_factory=NetConfig)
    marl: MarlConfig = field(default_factory=MarlConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    lr_anneal_from: Annotated[tuple[float, ...] | None, Suppress] = None
    """set by `klppo train --resume DIR --total-steps N` on a run whose learning rate anneals:
    (iteration k, fraction f). After iteration k the rate goes on from f * ppo.lr (the rate of
    iteration k) linearly towards 0 at the new end, as a new run does from ppo.lr; None: from
    iteration 0 at ppo.lr. Not a flag."""

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


#: the env prefix of a multi-agent (PettingZoo) run: ``pettingzoo:MODULE``
MULTIAGENT_PREFIX = "pettingzoo:"


def is_multiagent(env_id: str) -> bool:
    """``env_id`` names a PettingZoo parallel env (``pettingzoo:MODULE``)."""
    return isinstance(env_id, str) and env_id.startswith(MULTIAGENT_PREFIX)


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
