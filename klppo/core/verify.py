"""Check the library's identities on random batches it builds itself.

Returns plain data (``klppo verify`` prints it): Theorem 1 (gradient of PPO-Clip == gradient of
the per-sample KL template), Theorem 2 (min form == Phi form, in value), partition fractions,
a comparison of every controller on one scripted KL trace, and the KL estimator x placement x
correction table (:mod:`klppo.core.kl_gradients`) checked against the library's claims
(:mod:`klppo.core.kl_gradient_claims`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

import torch

from klppo.core.controllers import ControllerName, make_controller
from klppo.core.kl_gradient_claims import Mismatch, check_claims
from klppo.core.kl_gradients import GradientTable, enumerate_table
from klppo.core.surrogates import (
    clip_objective,
    partition,
    per_sample_kl_objective,
    phi_penalty,
)


@dataclass
class GradientCheck:
    """Theorem 1 at one batch size: over ``batches`` random batches, the largest absolute and
    relative difference of the two gradients and how many batches agreed bit for bit."""

    batch_size: int
    batches: int
    max_abs_diff: float
    max_rel_diff: float
    bit_identical_batches: int


@dataclass
class KLGradientCheck:
    """The enumerated KL gradient table and the cells where it disagrees with the claims."""

    table: GradientTable
    mismatches: list[Mismatch]

    @property
    def ok(self) -> bool:
        return not self.mismatches and all(c.verdict != "unclear" for c in self.table.cells)

    @property
    def max_unbiased_diff(self) -> float:
        """Largest |expected gradient - gradient of its KL| over the unbiased cells."""
        return max(min(c.diff_reverse, c.diff_forward) for c in self.table.cells
                   if c.verdict in ("reverse", "forward"))

    @property
    def min_biased_gap(self) -> float:
        """Smallest distance to the nearer KL gradient over the other cells."""
        return min(min(c.diff_reverse, c.diff_forward) for c in self.table.cells
                   if c.verdict not in ("reverse", "forward"))


@dataclass
class VerifyResult:
    """What ``klppo verify`` prints: Theorem 1 per batch size, Theorem 2's residuals (float32,
    float64, the smallest Phi), the partition fractions, the controllers on a KL trace and the
    KL gradient table."""

    theorem1: list[GradientCheck]
    theorem2_max_abs_diff: float
    theorem2_max_rel_diff: float
    theorem2_max_abs_diff_f64: float
    theorem2_min_phi: float
    fractions: dict[str, float]
    kl_trace: list[float]
    controller_betas: dict[str, list[float]]
    kl_gradients: KLGradientCheck

    @property
    def ok(self) -> bool:
        pow2 = [c for c in self.theorem1 if c.batch_size & (c.batch_size - 1) == 0]
        return (
            all(c.bit_identical_batches == c.batches for c in pow2)
            and all(c.max_rel_diff < 1e-5 for c in self.theorem1)
            and self.theorem2_max_rel_diff < 4 * torch.finfo(torch.float32).eps
            and self.theorem2_max_abs_diff_f64 < 1e-12
            and self.theorem2_min_phi >= 0.0
            and self.kl_gradients.ok
        )


def random_batch(
    batch_size: int, generator: torch.Generator, spread: float = 0.3
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A float32 batch ``(logp_new, logp_old, advantage)`` with kill, pass and in samples."""
    logp_old = -torch.rand(batch_size, generator=generator) * 3 - 0.05
    logp_new = logp_old + spread * torch.randn(batch_size, generator=generator)
    advantage = torch.randn(batch_size, generator=generator)
    return logp_new, logp_old, advantage


def gradient_pair(
    logp_new: torch.Tensor, logp_old: torch.Tensor, advantage: torch.Tensor, eps: float = 0.2
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients w.r.t. ``logp_new`` of mean PPO-Clip and of the mean per-sample template."""
    x = logp_new.detach().clone().requires_grad_(True)
    ratio = torch.exp(x - logp_old)
    (g_clip,) = torch.autograd.grad(clip_objective(ratio, advantage, eps).mean(), x)
    y = logp_new.detach().clone().requires_grad_(True)
    obj = cast(torch.Tensor, per_sample_kl_objective(y, logp_old, advantage, eps, shape="clip"))
    (g_tmpl,) = torch.autograd.grad(obj.mean(), y)
    return g_clip, g_tmpl


def verify(
    seed: int = 0, batches: int = 200, batch_sizes: tuple[int, ...] = (64, 256, 100, 1000)
) -> VerifyResult:
    """Run every check. Deterministic for a given seed."""
    gen = torch.Generator().manual_seed(seed)
    checks = []
    for bs in batch_sizes:
        max_abs = max_rel = 0.0
        identical = 0
        for _ in range(batches):
            logp_new, logp_old, adv = random_batch(bs, gen)
            g_clip, g_tmpl = gradient_pair(logp_new, logp_old, adv)
            diff = (g_clip - g_tmpl).abs()
            # relative to |w A| / B: the size of the two terms that cancel on a kill sample
            scale = (torch.exp(logp_new - logp_old) * adv).abs().clamp_min(1e-30) / bs
            max_abs = max(max_abs, float(diff.max()))
            max_rel = max(max_rel, float((diff / scale).max()))
            identical += int(torch.equal(g_clip, g_tmpl))
        checks.append(GradientCheck(bs, batches, max_abs, max_rel, identical))

    logp_new, logp_old, adv = random_batch(100_000, gen, spread=0.4)
    ratio = torch.exp(logp_new - logp_old)
    min_form = clip_objective(ratio, adv)
    phi = phi_penalty(ratio, adv)
    diff = (min_form - (ratio * adv - phi)).abs()
    t2 = float(diff.max())
    scale = torch.maximum((ratio * adv).abs(), min_form.abs()).clamp_min(1e-30)
    t2_rel = float((diff / scale).max())
    r64, a64 = ratio.double(), adv.double()
    t2_64 = float((clip_objective(r64, a64) - (r64 * a64 - phi_penalty(r64, a64))).abs().max())
    in_, pass_, kill = partition(ratio, adv)
    fractions = {
        "in": float(in_.float().mean()),
        "pass": float(pass_.float().mean()),
        "kill": float(kill.float().mean()),
    }

    trace = scripted_kl_trace()
    betas: dict[str, list[float]] = {}
    setups: dict[str, dict[str, Any]] = {
        "fixed": dict(beta=1.0, target=0.02),
        "step(ppo_paper)": dict(preset="ppo_paper", target=0.02),
        "step(rllib)": dict(preset="rllib", target=0.02),
        "step(klip)": dict(preset="klip"),
        "proportional": dict(beta=1.0, target=0.02, horizon=20),
        "exponential": dict(beta=1.0, target=0.02, gain=20.0),
        "pid": dict(beta=1.0, target=0.02, kp=10.0, ki=20.0),
    }
    for label, opts in setups.items():
        ctrl = make_controller(cast(ControllerName, label.split("(")[0]), **opts)
        betas[label] = [ctrl.update(d) for d in trace]
    table = enumerate_table(seed=seed)
    kl_check = KLGradientCheck(table, check_claims(table))
    return VerifyResult(checks, t2, t2_rel, t2_64, float(phi.min()), fractions, trace, betas,
                        kl_check)


def scripted_kl_trace(n: int = 12) -> list[float]:
    """A KL trace (nats per sample) that starts high, drops below a 0.02 target, then settles."""
    return [round(0.02 * (1 + 2.5 * math.exp(-i / 2) * math.cos(i)), 5) for i in range(n)]
