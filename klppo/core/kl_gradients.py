"""Which KL estimator, placed where, with which importance correction, has the gradient of which KL.

Everything here is exact: small categorical policies, every action (or token sequence)
enumerated, float64, expectations as weighted sums and gradients by autograd. No sampling.

**Setting.** A policy ``pi`` over sequences ``y = (y_1, ..., y_T)`` of tokens from a vocabulary
of ``V``, autoregressive and tabular: ``theta`` holds one logit vector per prefix (``[P, V]``,
``P = 1 + V + ... + V^(T-1)``). A frozen reference ``pi_ref`` and a sampler ``mu`` have logits of
the same shape. ``T = 1`` is one action (a bandit, or a one-token response); ``T = 3`` a short
response, where per-token and per-sequence choices part ways. Per token
``d_t = log pi(y_t | y_<t) - log pi_ref(y_t | y_<t)``; a sampled estimator ``k`` is the one of
:data:`klppo.core.kl.ESTIMATORS` evaluated on ``log r = -d_t`` (the samples nominally from ``pi``,
as :func:`klppo.core.kl.sampled_kl` ``(logp, logp_ref)`` is called in RLHF). ``full`` is the exact
per-prefix ``KL(pi(.|y_<t) || pi_ref(.|y_<t))`` (:func:`klppo.core.kl.analytic_kl`: the LM loop's
``full``, the Gymnasium trainer's ``analytic``).

**Granularity.** ``token``: ``K(y) = sum_t k(d_t)`` (each token's estimate, summed: what the RLHF
loop, TRL and GRPO do); ``sequence``: ``K(y) = k(sum_t d_t)`` (the estimator applied to the
sequence log-ratio). At ``T = 1`` they coincide and only ``token`` is listed.

**Placement** (the per-sample gradient, before the expectation):

* ``reward``: the estimate is detached and enters as a score-function term,
  ``K(y) grad log pi(y)`` (the penalty ``-beta K`` in the reward; per-token rewards credited
  through returns-to-go with ``gamma = 1`` have the same expectation);
* ``loss``: ``K(y)`` is differentiated through ``log pi`` with the sample held fixed: ``grad K``.

**Correction** (where the samples come from, and where the ratio is applied):

* ``on_policy``: ``y ~ pi``, no ratio;
* ``ratio``: ``y ~ mu``; the sample's ratio ``w = pi(y) / mu(y)``, detached, multiplies the
  per-sample gradient term: ``w K grad log pi`` (reward: the gradient of PPO's ``w A``) or
  ``w grad K`` (loss);
* ``ratio_grad``: ``y ~ mu``; ``w`` multiplies the per-sample *value* and is differentiated:
  ``grad(w sg(K))`` (reward: the same gradient as ``ratio``) or ``grad(w K)`` (loss: ratio and
  estimator both differentiated; on-policy this is the ``pi / sg(pi)`` trick);
* ``token_ratio_grad`` (``T > 1``, token granularity): ``y ~ mu``; the per-token ratio
  ``w_t = pi(y_t | y_<t) / mu(y_t | y_<t)`` multiplies each token's term, differentiated:
  ``sum_t w_t sg(sum_{s >= t} k_s)`` (reward: PPO with the KL in the per-token returns) or
  ``sum_t w_t k_t`` (loss: DeepSeek-V3.2's and TRL's ``use_bias_correction_kl``);
* ``none``: ``y ~ mu``, no ratio (e.g. later PPO epochs with the KL in the loss);
* ``seq_mean_ratio_grad`` (``T > 1``, token granularity, loss): ``y ~ mu``; GSPO's
  length-normalised sequence ratio ``exp(mean_t log w_t)``, differentiated, multiplies every
  token's term: ``exp(mean_t log w_t) sum_t k_t`` (TRL's ``use_bias_correction_kl`` with
  ``importance_sampling_level="sequence"``).

The expected gradient ``sum_y q(y) g(y)`` (``q = pi`` or ``mu``, as weights that are not
differentiated) is compared with the gradients of ``KL(pi || pi_ref)`` (*reverse*) and
``KL(pi_ref || pi)`` (*forward*), each by autograd on its closed form over all ``V^T``
sequences. A combination is *reverse* (or *forward*) when it matches that gradient to ``tol``
on every random instance, *neither* when it is at least ``gap`` from both on some instance, and
*unclear* otherwise (which :mod:`klppo.core.kl_gradient_claims` treats as a failure). Sources:
Tang & Munos, arXiv:2506.09477; Zhang et al., arXiv:2505.17508; Shah et al., arXiv:2512.21852.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import distributions as D

from klppo.core.kl import ESTIMATORS, analytic_kl

__all__ = ["GRADIENT_ESTIMATORS", "PLACEMENTS", "GRANULARITIES", "CORRECTIONS", "HORIZONS",
           "ESTIMATOR_ALIASES", "Combination", "Instance", "CellResult", "GradientTable",
           "combinations", "random_instance", "expected_gradient", "exact_gradients",
           "enumerate_table"]

#: every estimator klppo has: the sampled ones of klppo.core.kl, and the exact per-state KL
GRADIENT_ESTIMATORS: tuple[str, ...] = (*ESTIMATORS, "full")
#: other names of the same estimator (the Gymnasium trainer calls the exact KL "analytic")
ESTIMATOR_ALIASES: dict[str, str] = {"analytic": "full"}
PLACEMENTS: tuple[str, ...] = ("reward", "loss")
GRANULARITIES: tuple[str, ...] = ("token", "sequence")
CORRECTIONS: tuple[str, ...] = ("on_policy", "ratio", "ratio_grad", "token_ratio_grad", "none",
                                 "seq_mean_ratio_grad")
#: sequence lengths enumerated, with their vocabulary sizes (4 actions; 2^3 = 8 sequences)
HORIZONS: dict[int, int] = {1: 4, 3: 2}
TOL = 1e-10
GAP = 1e-4


@dataclass(frozen=True)
class Combination:
    """One cell of the table: estimator x placement x granularity x correction, at a horizon."""

    estimator: str
    placement: str
    granularity: str
    correction: str
    horizon: int = 1

    def applies(self) -> bool:
        """False for cells that do not exist: a per-sequence ``full`` KL, sequence granularity
        at ``T = 1`` (it equals token), and per-token ratios on a per-sequence estimate."""
        if self.granularity == "sequence" and (self.horizon == 1 or self.estimator == "full"):
            return False
        if self.correction == "seq_mean_ratio_grad":
            return self.horizon > 1 and self.granularity == "token" and self.placement == "loss"
        return self.correction != "token_ratio_grad" or (
            self.horizon > 1 and self.granularity == "token")

    def describe(self) -> str:
        """E.g. ``k3 in the loss (per token, on-policy, 3 tokens)``."""
        where = "in the reward" if self.placement == "reward" else "in the loss"
        unit = "per token" if self.granularity == "token" else "on the sequence log-ratio"
        corr = {"on_policy": "on-policy", "ratio": "off-policy, detached ratio",
                "ratio_grad": "off-policy, differentiated ratio",
                "token_ratio_grad": "off-policy, differentiated per-token ratio",
                "none": "off-policy, no ratio",
                "seq_mean_ratio_grad": "off-policy, differentiated length-normalised sequence "
                                       "ratio"}[self.correction]
        tokens = "1 token" if self.horizon == 1 else f"{self.horizon} tokens"
        return f"{self.estimator} {where} ({unit}, {corr}, {tokens})"


def combinations(horizons: tuple[int, ...] = tuple(HORIZONS)) -> list[Combination]:
    """Every applicable combination at the given horizons, in table order."""
    out = []
    for h, place, gran, est, corr in itertools.product(
            horizons, PLACEMENTS, GRANULARITIES, GRADIENT_ESTIMATORS, CORRECTIONS):
        c = Combination(est, place, gran, corr, h)
        if c.applies():
            out.append(c)
    return out


@dataclass(frozen=True)
class Instance:
    """Logits ``[P, V]`` (float64) of the policy, the reference and the sampler."""

    theta: torch.Tensor
    ref: torch.Tensor
    mu: torch.Tensor

    @property
    def horizon(self) -> int:
        """T, from the number of prefixes P = (V^T - 1) / (V - 1)."""
        v, p, t = self.theta.shape[1], self.theta.shape[0], 0
        while p > 0:
            p, t = p - v**t, t + 1
        return t


def random_instance(horizon: int, vocab: int, generator: torch.Generator,
                    scale: float = 1.0) -> Instance:
    """Logits drawn from ``N(0, scale^2)`` for the policy, the reference and the sampler."""
    n = sum(vocab**t for t in range(horizon))
    draw = lambda: scale * torch.randn(n, vocab, generator=generator, dtype=torch.float64)
    return Instance(draw(), draw(), draw())


@lru_cache(maxsize=8)
def _index(horizon: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(prefix ids, tokens)``, each ``[V^T, T]``: the row of the logits that predicts token t
    of each sequence, and the token. Prefixes are numbered by length, then as base-V numbers."""
    seqs = list(itertools.product(range(vocab), repeat=horizon))
    offsets = [sum(vocab**s for s in range(t)) for t in range(horizon)]
    prefix = [[offsets[t] + sum(y[s] * vocab**(t - 1 - s) for s in range(t))
               for t in range(horizon)] for y in seqs]
    return torch.tensor(prefix), torch.tensor(seqs)


def _token_logp(logits: torch.Tensor, horizon: int) -> torch.Tensor:
    """``[V^T, T]`` log-probability of every token of every sequence."""
    prefix, tokens = _index(horizon, logits.shape[1])
    return torch.log_softmax(logits, -1)[prefix, tokens]


def _per_token(estimator: str, theta: torch.Tensor, inst: Instance, lp: torch.Tensor,
               lr: torch.Tensor) -> torch.Tensor:
    """``[V^T, T]`` per-token estimate, differentiable in ``theta``."""
    if estimator == "full":
        kl = analytic_kl(D.Categorical(logits=theta), D.Categorical(logits=inst.ref))
        return kl[_index(inst.horizon, theta.shape[1])[0]]
    return ESTIMATORS[estimator](lr - lp)


def _surrogate(c: Combination, big_k: torch.Tensor, k_tok: torch.Tensor, lp: torch.Tensor,
               lm: torch.Tensor) -> torch.Tensor:
    """``[V^T]`` per-sample surrogate whose gradient is the per-sample gradient term."""
    logp = lp.sum(1)
    w = torch.exp(logp - lm.sum(1))
    w_tok = torch.exp(lp - lm)
    if c.placement == "reward":
        big_k = big_k.detach()
        if c.correction == "ratio":
            return (w.detach() * big_k) * logp
        if c.correction == "ratio_grad":
            return w * big_k
        if c.correction == "token_ratio_grad":
            to_go = k_tok.detach().flip(1).cumsum(1).flip(1)
            return (w_tok * to_go).sum(1)
        return big_k * logp  # on_policy, none
    if c.correction == "ratio":
        return w.detach() * big_k
    if c.correction == "ratio_grad":
        return w * big_k
    if c.correction == "token_ratio_grad":
        return (w_tok * k_tok).sum(1)
    if c.correction == "seq_mean_ratio_grad":  # GSPO's exp(mean_t log w_t) on every token's term
        return torch.exp((lp - lm).mean(1)) * k_tok.sum(1)
    return big_k  # on_policy, none


def expected_gradient(c: Combination, inst: Instance) -> torch.Tensor:
    """``[P, V]`` expected gradient (w.r.t. the policy's logits) of the combination's KL term,
    exactly: the sum over every sequence of its sampling probability times its per-sample
    gradient. The direction the penalty pushes is minus this (it is descended)."""
    if not c.applies():
        raise ValueError(f"combination does not apply: {c}")
    if inst.horizon != c.horizon:
        raise ValueError(f"instance has horizon {inst.horizon}, combination {c.horizon}")
    theta = inst.theta.detach().clone().requires_grad_(True)
    lp = _token_logp(theta, c.horizon)
    lr, lm = _token_logp(inst.ref, c.horizon), _token_logp(inst.mu, c.horizon)
    k_tok = _per_token(c.estimator, theta, inst, lp, lr)
    if c.granularity == "token":
        big_k = k_tok.sum(1)
    else:
        big_k = ESTIMATORS[c.estimator]((lr - lp).sum(1))
    weight = (lp if c.correction == "on_policy" else lm).sum(1).detach().exp()
    s = _surrogate(c, big_k, k_tok, lp, lm)
    (g,) = torch.autograd.grad((weight * s).sum(), theta)
    return g


def exact_gradients(inst: Instance) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients w.r.t. the policy's logits of ``KL(pi || pi_ref)`` (reverse) and
    ``KL(pi_ref || pi)`` (forward) over whole sequences, by autograd on the closed forms
    ``sum_y p(y) (log p(y) - log q(y))``."""
    theta = inst.theta.detach().clone().requires_grad_(True)
    logp = _token_logp(theta, inst.horizon).sum(1)
    logref = _token_logp(inst.ref, inst.horizon).sum(1)
    reverse = (logp.exp() * (logp - logref)).sum()
    forward = (logref.exp() * (logref - logp)).sum()
    (g_rev,) = torch.autograd.grad(reverse, theta, retain_graph=True)
    (g_fwd,) = torch.autograd.grad(forward, theta)
    return g_rev, g_fwd


@dataclass(frozen=True)
class CellResult:
    """A combination's verdict and the distances behind it: the largest absolute difference
    (over instances and logits) of its expected gradient from the reverse and the forward KL
    gradients, and the largest absolute entry of the expected gradient (``size``)."""

    combination: Combination
    verdict: str
    diff_reverse: float
    diff_forward: float
    size: float

    @property
    def zero(self) -> bool:
        """True when the expected gradient is 0 (to float precision) on every instance."""
        return self.size <= TOL


@dataclass(frozen=True)
class GradientTable:
    """Every cell, with the settings of the enumeration. ``separation``: the smallest, over
    instances, largest difference between the reverse and the forward KL gradients."""

    cells: tuple[CellResult, ...]
    instances: int
    seed: int
    tol: float
    gap: float
    separation: float

    def cell(self, estimator: str, placement: str, correction: str, granularity: str = "token",
             horizon: int = 1) -> CellResult:
        """The cell of one combination (``analytic`` is ``full``)."""
        est = ESTIMATOR_ALIASES.get(estimator, estimator)
        want = Combination(est, placement, granularity, correction, horizon)
        for r in self.cells:
            if r.combination == want:
                return r
        raise KeyError(f"no cell {want}")


def _verdict(d_rev: float, d_fwd: float, tol: float, gap: float) -> str:
    if d_rev <= tol:
        return "reverse"
    if d_fwd <= tol:
        return "forward"
    return "neither" if min(d_rev, d_fwd) >= gap else "unclear"


def enumerate_table(instances: int = 4, seed: int = 0, tol: float = TOL,
                    gap: float = GAP) -> GradientTable:
    """Enumerate every combination on ``instances`` random policies per horizon (logits
    ``N(0, 1)``, float64, seeded) and return the verdicts. Deterministic for a given seed."""
    gen = torch.Generator().manual_seed(seed)
    cells, separation = [], float("inf")
    for horizon, vocab in HORIZONS.items():
        insts = [random_instance(horizon, vocab, gen) for _ in range(instances)]
        exact = [exact_gradients(i) for i in insts]
        separation = min([separation, *(float((r - f).abs().max()) for r, f in exact)])
        for c in combinations((horizon,)):
            grads = [expected_gradient(c, i) for i in insts]
            d_rev = max(float((g - r).abs().max()) for g, (r, _) in zip(grads, exact))
            d_fwd = max(float((g - f).abs().max()) for g, (_, f) in zip(grads, exact))
            size = max(float(g.abs().max()) for g in grads)
            cells.append(CellResult(c, _verdict(d_rev, d_fwd, tol, gap), d_rev, d_fwd, size))
    return GradientTable(tuple(cells), instances, seed, tol, gap, separation)
