import copy

import numpy as np
import pytest
import torch

from klppo.core.loss import PPOLoss
from klppo.nn import ActorCritic, CategoricalHead, DiagGaussianHead
from klppo.nn.fastpath import FastStep, flatten_parameters, supports_fast_path


def make_batches(agent, head, rng, count, n, obs_dim, old_shift=None):
    """Minibatches (obs, act, old params, old logp, adv, returns, old values) around the agent's
    current policy: old params = current + shift (random noise when ``old_shift`` is None)."""
    batches = []
    for _ in range(count):
        obs = rng.standard_normal((n, obs_dim)).astype(np.float32)
        with torch.no_grad():
            old = agent.policy_params(torch.from_numpy(obs))
            old = old + (0.3 * torch.randn_like(old) if old_shift is None else old_shift)
            act = head.sample(old)
            lo = head.log_prob(old, act)
        batches.append((obs, act.numpy(), old.numpy(), lo.numpy(),
                        rng.standard_normal(n).astype(np.float32) * 3,
                        rng.standard_normal(n).astype(np.float32),
                        rng.standard_normal(n).astype(np.float32)))
    return batches


def reference_steps(agent, loss, batches, beta, lr=3e-4, eps=1e-5, max_norm=0.5):
    opt = torch.optim.Adam(agent.parameters(), lr=lr, eps=eps)
    for obs, act, old, lo, adv, ret, vold in batches:
        params, v = agent(torch.from_numpy(obs))
        a = torch.from_numpy(act)
        lp = agent.head.log_prob(params, a)
        ent = agent.head.entropy(params)
        kl = agent.head.kl(torch.from_numpy(old), params)
        out = loss(lp, torch.from_numpy(lo), torch.from_numpy(adv), v, torch.from_numpy(ret),
                   torch.from_numpy(vold), ent, kl if loss.needs_analytic_kl else None, beta)
        opt.zero_grad()
        out["loss"].backward()
        torch.nn.utils.clip_grad_norm_(agent.parameters(), max_norm)
        opt.step()


@pytest.mark.parametrize("head", ["categorical", "gaussian"])
@pytest.mark.parametrize("objective, ent_coef, opts", [
    ("clip", 0.0, {}), ("clip", 0.05, {"value_loss": "l1"}),
    ("kl_penalty", 0.01, {}), ("kl_penalty", 0.0, {"kl_estimator": "k3"}),
    ("kl_penalty", 0.0, {"kl_estimator": "k1", "value_clip": None}),
    ("clip_kl", 0.0, {"kl_estimator": "k2", "value_loss": "smooth_l1"}),
    ("clip_kl", 0.0, {"kl_estimator": "abs", "dual_clip": 3.0}),
    ("unclipped", 0.0, {"normalize_advantage": "minibatch"}),
    ("per_sample_kl", 0.0, {}),
    ("per_sample_kl", 0.0, {"shape": "sigmoid", "softness": 0.1, "eps_high": 0.28}),
    ("per_sample_kl", 0.0, {"shape": "spo"}),
])
def test_fast_step_matches_autograd_and_adam(head, objective, ent_coef, opts):
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    h = CategoricalHead(3) if head == "categorical" else DiagGaussianHead(2)
    agent = ActorCritic(5, h, log_std_init=-0.3)
    ref = copy.deepcopy(agent)
    loss = PPOLoss(objective, ent_coef=ent_coef, **opts)
    batches = make_batches(agent, h, rng, count=4, n=64, obs_dim=5)
    start = [q.detach().clone() for q in ref.parameters()]
    reference_steps(ref, loss, batches, beta=0.7)
    flat, spans = flatten_parameters(agent)
    step = FastStep(agent, loss, 3e-4, 1e-5, 0.5, flat, spans)
    for obs, act, old, lo, adv, ret, vold in batches:
        step.step(obs, act, old, lo, adv, ret, vold, 0.7, ent_coef > 0, loss.needs_analytic_kl)
    for (name, p), q in zip(agent.named_parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=2e-6, rtol=1e-5), name
    obs, _, old = batches[0][:3]
    with torch.no_grad():
        expect = h.kl(torch.from_numpy(old), agent.policy_params(torch.from_numpy(obs))).mean()
    assert step.policy_kl(obs, old) == pytest.approx(float(expect), rel=1e-4, abs=1e-7)
    assert all(not torch.equal(a, b) for a, b in zip(start, ref.parameters()))  # they moved


def test_flatten_keeps_values_and_makes_views():
    agent = ActorCritic(3, CategoricalHead(2))
    before = [p.detach().clone() for p in agent.parameters()]
    flat, spans = flatten_parameters(agent)
    assert all(torch.equal(a, b) for a, b in zip(before, agent.parameters()))
    flat[:] = 0
    assert all(float(p.detach().abs().sum()) == 0 for p in agent.parameters())
    agent.load_state_dict({k: torch.ones_like(v) for k, v in agent.state_dict().items()})
    assert float(flat.min()) == 1.0  # in-place loads keep the views
    assert supports_fast_path(agent)
    assert not supports_fast_path(ActorCritic(3, CategoricalHead(2), shared_trunk=True))


@pytest.mark.parametrize("hidden", [(32, 48, 16), (8,), (64, 64, 64, 64)])
def test_fast_step_any_depth_and_width(hidden):
    """The fast path equals autograd + Adam for any depth and width of the MLPs."""
    torch.manual_seed(1)
    rng = np.random.default_rng(1)
    h = CategoricalHead(4)
    agent = ActorCritic(6, h, hidden=hidden)
    ref = copy.deepcopy(agent)
    loss = PPOLoss("clip")
    batches = make_batches(agent, h, rng, count=3, n=128, obs_dim=6, old_shift=0.3)
    reference_steps(ref, loss, batches, beta=0.0)
    step = FastStep(agent, loss, 3e-4, 1e-5, 0.5, *flatten_parameters(agent))
    for b in batches:
        step.step(*b, 0.0, False, False)
    for (name, p), q in zip(agent.named_parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=2e-6, rtol=1e-5), name
