import math

import pytest
import torch
from torch import distributions as D

from klppo.core.loss import PPOLoss
from klppo.core.values import entropy, explained_variance, value_loss
from klppo.nn import ActorCritic, CategoricalHead, DiagGaussianHead


def test_value_loss_kinds_and_clipping_hand_values():
    v = torch.tensor([1.0, 3.0, 0.0])
    r = torch.tensor([2.0, 0.0, 0.5])
    old = torch.tensor([0.5, 2.0, 0.0])
    l2, clipped = value_loss(v, r, kind="l2")
    assert l2.tolist() == pytest.approx([0.5, 4.5, 0.125]) and not clipped.any()
    assert value_loss(v, r, kind="l1")[0].tolist() == pytest.approx([1.0, 3.0, 0.5])
    assert value_loss(v, r, kind="smooth_l1")[0].tolist() == pytest.approx([0.5, 2.5, 0.125])
    # clip 0.2: v_clipped = old + clamp(v - old) = [0.7, 2.2, 0.0]; losses [0.845, 2.42, 0.125]
    loss, clipped = value_loss(v, r, old, clip=0.2)
    assert loss.tolist() == pytest.approx([0.845, 4.5, 0.125])
    assert clipped.tolist() == [True, False, False]


def test_entropy_closed_form_and_monte_carlo():
    d = D.Normal(torch.tensor([0.0, 1.0]), torch.tensor([1.0, 2.0]))
    assert torch.allclose(entropy(d), 0.5 * torch.log(2 * math.pi * math.e * d.scale**2))
    mix = D.MixtureSameFamily(D.Categorical(torch.tensor([0.5, 0.5])),
                              D.Normal(torch.tensor([-2.0, 2.0]), torch.tensor([0.5, 0.5])))
    grid = torch.linspace(-10, 10, 100_001, dtype=torch.float64)
    lp = mix.log_prob(grid.float()).double()
    exact = -torch.trapezoid(lp.exp() * lp, grid).item()
    assert entropy(mix, num_samples=200_000, seed=0).item() == pytest.approx(exact, abs=0.01)


def test_explained_variance():
    r = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert explained_variance(r, r).item() == 1.0
    assert explained_variance(torch.full((4,), 2.5), r).item() == pytest.approx(0.0)
    assert math.isnan(explained_variance(r, torch.ones(4)).item())


def make_batch(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    lo = -torch.rand(n, generator=g) - 0.1
    lp = (lo + 0.3 * torch.randn(n, generator=g)).requires_grad_(True)
    return lp, lo, torch.randn(n, generator=g)


def test_loss_named_terms_and_detached_diagnostics():
    lp, lo, a = make_batch()
    v = torch.randn(64, requires_grad=True)
    ent = torch.rand(64, requires_grad=True)
    loss = PPOLoss("per_sample_kl", ent_coef=0.01, value_clip=None)
    out = loss(lp, lo, a, values=v, returns=torch.randn(64), entropy=ent)
    for k in ("loss", "loss_objective", "loss_critic", "loss_entropy"):
        assert out[k].requires_grad
    assert torch.allclose(out["loss"], out["loss_objective"] + out["loss_critic"]
                          + out["loss_entropy"])
    diag = {k: t for k, t in out.items() if not k.startswith("loss")}
    assert {"kl_k1", "kl_k3", "ratio_mean", "ratio_min", "ratio_max", "clip_fraction",
            "frac_in", "frac_pass", "frac_kill", "beta_t_abs_mean", "beta_t_kill_mean",
            "beta_t_q50", "beta_t_q90", "beta_t_q99", "entropy", "explained_variance",
            "value_clip_fraction"} <= set(diag)
    assert not any(t.requires_grad for t in diag.values())
    assert out["frac_in"] + out["frac_pass"] + out["frac_kill"] == pytest.approx(1.0)
    assert out["loss_entropy"].item() == pytest.approx(-0.01 * ent.mean().item())


def test_loss_objectives_agree_where_theory_says():
    lp, lo, a = make_batch(128)
    grads = {}
    for obj in ("clip", "per_sample_kl", "unclipped"):
        out = PPOLoss(obj)(lp, lo, a)
        (grads[obj],) = torch.autograd.grad(out["loss"], lp)
    assert torch.equal(grads["clip"], grads["per_sample_kl"])
    assert not torch.equal(grads["clip"], grads["unclipped"])
    out0 = PPOLoss("kl_penalty", kl_estimator="k3")(lp, lo, a, beta=0.0)
    assert torch.equal(torch.autograd.grad(out0["loss"], lp)[0], grads["unclipped"])
    kl = torch.rand(128)
    out = PPOLoss("kl_penalty")(lp, lo, a, kl=kl, beta=2.0)
    expected = -(torch.exp(lp - lo) * a - 2.0 * kl).mean()
    assert torch.allclose(out["loss_objective"], expected)
    assert out["kl_penalty"].item() == pytest.approx(kl.mean().item())


def test_loss_errors():
    lp, lo, a = make_batch()
    with pytest.raises(ValueError, match="objective must be one of"):
        PPOLoss("trpo")
    with pytest.raises(ValueError, match="needs kl="):
        PPOLoss("kl_penalty")(lp, lo, a)
    with pytest.raises(ValueError, match="shape mismatch"):
        PPOLoss()(lp, lo, a[:, None])


def test_separate_losses_isolates_the_shared_trunk():
    torch.manual_seed(0)
    obs = torch.randn(32, 4)
    for separate in (False, True):
        net = ActorCritic(4, CategoricalHead(3), shared_trunk=True, separate_losses=separate)
        params, value = net(obs)
        critic_loss = (value - 1.0).square().mean()
        trunk_grads = torch.autograd.grad(critic_loss, list(net.trunk.parameters()),
                                          allow_unused=True)
        touched = any(g is not None and bool(g.abs().sum() > 0) for g in trunk_grads)
        assert touched != separate
    # the policy loss still reaches the trunk
    act = torch.randint(0, 3, (32,))
    logp = net.head.log_prob(net.policy_params(obs), act)
    g = torch.autograd.grad(logp.sum(), list(net.trunk.parameters()))
    assert all(bool(x.abs().sum() > 0) for x in g)


def test_heads_match_torch_distributions():
    torch.manual_seed(0)
    for head, params, act in (
        (CategoricalHead(5), torch.randn(7, 5), torch.randint(0, 5, (7,))),
        (DiagGaussianHead(3), torch.randn(7, 6), torch.randn(7, 3)),
    ):
        d = head.to_torch(params)
        assert torch.allclose(head.log_prob(params, act), d.log_prob(act), atol=1e-5)
        assert torch.allclose(head.entropy(params), d.entropy(), atol=1e-5)
        other = params + 0.3 * torch.randn_like(params)
        assert torch.allclose(head.kl(params, other),
                              D.kl_divergence(d, head.to_torch(other)), atol=1e-5)
