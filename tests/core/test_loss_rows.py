"""``PPOLoss(rows=True)``: A policies' minibatches ``[A, B]`` in one call (the torch stack's
families), every term and per-sample output and every gradient equal, bit for bit, to each
row's own call."""

from __future__ import annotations

import pytest
import torch

from klppo.core.loss import PPOLoss
from klppo.nn.distributions import CategoricalHead

LOSSES = {
    "clip": dict(objective="clip"),
    "clip-asymmetric-dual": dict(objective="clip", eps_low=0.2, eps_high=0.28, dual_clip=3.0),
    "per_sample_kl": dict(objective="per_sample_kl"),
    "kl_penalty-k3": dict(objective="kl_penalty", kl_estimator="k3"),
    "kl_penalty-analytic": dict(objective="kl_penalty", kl_estimator="analytic"),
    "clip_kl-k2": dict(objective="clip_kl", kl_estimator="k2"),
    "unclipped": dict(objective="unclipped"),
    "minibatch-norm-entropy-l1": dict(objective="clip", normalize_advantage="minibatch",
                                      ent_coef=0.01, value_loss="l1", value_clip=None),
}


def _inputs(A: int, B: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    head = CategoricalHead(3)
    params = torch.randn(A, B, 3, generator=g)
    old = params + 0.3 * torch.randn(A, B, 3, generator=g)
    actions = torch.randint(0, 3, (A, B), generator=g)
    return dict(params=params, old=old, logp_old=head.log_prob(old, actions), actions=actions,
                adv=torch.randn(A, B, generator=g) * 2, values=torch.randn(A, B, generator=g),
                returns=torch.randn(A, B, generator=g), old_values=torch.randn(A, B, generator=g),
                weight=torch.rand(A, B, generator=g))


def _call(loss: PPOLoss, x: dict[str, torch.Tensor], at, rows: bool, weighted: bool,
          beta: float | torch.Tensor = 0.07):
    """The loss of ``x[at]`` and the gradients of its summed terms to the logits and values."""
    head = CategoricalHead(3)
    params = x["params"][at].clone().requires_grad_(True)
    values = x["values"][at].clone().requires_grad_(True)
    logp = head.log_prob(params, x["actions"][at])
    out = loss(logp, x["logp_old"][at], x["adv"][at], values, x["returns"][at],
               x["old_values"][at], head.entropy(params), head.kl(x["old"][at], params), beta,
               diagnostics=False, per_sample=True, rows=rows,
               sample_weight=x["weight"][at] if weighted else None)
    g_params, g_values = torch.autograd.grad(out["loss"].sum(), (params, values))
    return out, g_params, g_values


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("B", [1, 7, 64, 333])
@pytest.mark.parametrize("name", list(LOSSES))
def test_each_rows_terms_and_gradients_are_its_own_calls(name, B, weighted):
    loss, A = PPOLoss(**LOSSES[name]), 4
    x = _inputs(A, B, seed=B)
    rows, g_rows, gv_rows = _call(loss, x, slice(None), True, weighted)
    assert rows["loss"].shape == (A,)
    for a in range(A):
        alone, g_alone, gv_alone = _call(loss, x, a, False, weighted)
        assert set(alone) == set(rows)
        for k, v in alone.items():
            assert torch.equal(rows[k][a], v), (k, a)
        assert torch.equal(g_rows[a], g_alone) and torch.equal(gv_rows[a], gv_alone)


def test_rows_refuses_what_it_cannot_compute_per_row():
    x = _inputs(2, 8, seed=0)
    head = CategoricalHead(3)
    logp = head.log_prob(x["params"], x["actions"])
    with pytest.raises(ValueError, match="rows=True"):
        PPOLoss("clip")(logp, x["logp_old"], x["adv"], rows=True)  # diagnostics on
    with pytest.raises(ValueError, match="rows=True"):
        PPOLoss("gspo")(logp, x["logp_old"], x["adv"], diagnostics=False, rows=True)
    with pytest.raises(ValueError, match="rows=True"):
        PPOLoss("clip")(logp[0], x["logp_old"][0], x["adv"][0], diagnostics=False, rows=True)


@pytest.mark.parametrize("B", [7, 64, 333])
@pytest.mark.parametrize("name", ["kl_penalty-k3", "kl_penalty-analytic", "clip_kl-k2"])
def test_a_beta_per_row_gives_each_row_its_own_calls_numbers(name, B):
    """``beta`` as an ``[A]`` tensor (the betas of several adaptive controllers): each row's
    terms and gradients those of its own call with its beta as a float."""
    loss, A = PPOLoss(**LOSSES[name]), 4
    x = _inputs(A, B, seed=B + 1)
    betas = [0.07, 1.3, 1e-4, 0.3333333333]
    rows, g_rows, gv_rows = _call(loss, x, slice(None), True, False,
                                  torch.tensor(betas, dtype=torch.float64))
    for a in range(A):
        alone, g_alone, gv_alone = _call(loss, x, a, False, False, betas[a])
        for k, v in alone.items():
            assert torch.equal(rows[k][a], v), (k, a)
        assert torch.equal(g_rows[a], g_alone) and torch.equal(gv_rows[a], gv_alone)
