"""Configuration of the RLHF-style experiment (one dataclass; each field's docstring is --help)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from klppo.core.controllers import CONTROLLERS, ControllerName

KLEstimatorLM = Literal["k1", "k3", "full"]
KLPlacement = Literal["reward", "loss"]
KLUnitLM = Literal["per_sequence_sum", "per_token_mean"]

__all__ = ["RLHFConfig", "validate_rlhf"]


@dataclass
class RLHFConfig:
    """PPO on a language model kept near a frozen reference by a KL penalty."""

    model: str = "runs/lm/base"
    """Hugging Face model directory: the initial policy and the frozen reference"""
    out: str | None = None
    """run directory to create (default runs/rlhf/{controller}__beta{beta}__{seed}__{time})"""
    seed: int = 0
    """seed of prompt choice, sampling and minibatch order"""
    iterations: int = 150
    """PPO iterations (the budget; never wall-clock)"""
    batch_size: int = 32
    """episodes (prompt + sampled response) per iteration"""
    prompt_len: int = 16
    """prompt tokens: a window of the training text"""
    response_len: int = 24
    """sampled response tokens"""
    temperature: float = 1.0
    """sampling temperature"""
    stop_at_eos: bool = False
    """treat tokens after an end-of-text token as padding"""
    reward: str = "vader"
    """task score: vader, or classifier:PATH[:LABEL] for a local HF classifier"""
    kl_estimator: KLEstimatorLM = "k1"
    """per-token KL(policy || reference): k1, k3 or full (exact over the vocabulary)"""
    kl_placement: KLPlacement = "reward"
    """reward: -beta KL_t in every token's reward (Ziegler/TRL); loss: beta k3 in the loss (GRPO)"""
    kl_unit: KLUnitLM = "per_sequence_sum"
    """unit of the KL fed to the controller and of the target"""
    controller: ControllerName = "proportional"
    """fixed, step, proportional, exponential or pid"""
    beta: float = 0.1
    """initial KL coefficient"""
    target: float = 6.0
    """target KL in kl_unit (Ziegler et al.: 6 nats per sequence)"""
    horizon: float | None = None
    """proportional horizon in episodes (None: iterations * batch_size / 30)"""
    beta_min: float = 0.0
    """lower bound on beta"""
    beta_max: float = 100.0
    """upper bound on beta"""
    ppo_epochs: int = 4
    """PPO epochs per iteration"""
    minibatch_size: int = 8
    """sequences per minibatch"""
    lr: float = 1e-4
    """Adam learning rate of the policy and value head"""
    eps: float = 0.2
    """PPO clip radius"""
    value_clip: float = 0.2
    """value clipping radius"""
    vf_coef: float = 0.1
    """value loss weight"""
    gamma: float = 1.0
    """discount over response tokens"""
    lam: float = 0.95
    """GAE lambda"""
    max_grad_norm: float = 1.0
    """global gradient-norm clip"""
    eval_every: int = 10
    """iterations between held-out perplexity evaluations (and sample texts)"""
    eval_windows: int = 64
    """held-out windows for perplexity (evenly spaced, the same ones every evaluation)"""
    eval_seq_len: int = 64
    """tokens per held-out window (the pretraining context: longer windows reach positions the
    model never trained on)"""
    checkpoint_every: int = 25
    """iterations between checkpoints"""
    torch_threads: int = 1
    """torch threads (1 per arm; arms run as parallel processes)"""

    @property
    def episodes(self) -> int:
        return self.iterations * self.batch_size

    @property
    def effective_horizon(self) -> float:
        return self.horizon if self.horizon is not None else max(1.0, self.episodes / 30)


def validate_rlhf(c: RLHFConfig) -> RLHFConfig:
    def bad(field: str, why: str) -> ValueError:
        return ValueError(f"{field}={getattr(c, field)!r}: {why}")

    for f in ("iterations", "batch_size", "prompt_len", "response_len", "ppo_epochs",
              "minibatch_size", "eval_every", "eval_windows", "eval_seq_len", "checkpoint_every",
              "torch_threads"):
        if not isinstance(getattr(c, f), int) or getattr(c, f) < 1:
            raise bad(f, "must be an integer >= 1")
    if c.batch_size % c.minibatch_size:
        raise bad("minibatch_size", f"must divide batch_size={c.batch_size}")
    for f in ("temperature", "lr", "eps", "value_clip", "max_grad_norm", "target"):
        v = getattr(c, f)
        if not (math.isfinite(v) and v > 0):
            raise bad(f, "must be finite and > 0")
    if not (math.isfinite(c.beta) and c.beta >= 0):
        raise bad("beta", "must be finite and >= 0")
    if c.controller not in CONTROLLERS:
        raise bad("controller", f"must be one of {sorted(CONTROLLERS)}")
    if c.kl_estimator not in ("k1", "k3", "full"):
        raise bad("kl_estimator", "must be k1, k3 or full")
    if c.kl_placement not in ("reward", "loss"):
        raise bad("kl_placement", "must be reward or loss")
    if c.horizon is not None and not c.horizon > 0:
        raise bad("horizon", "must be > 0")
    return c
