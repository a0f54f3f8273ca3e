import copy

import numpy as np
import pytest
import torch

from klppo.core.loss import PPOLoss
from klppo.core.objectives import KL_ESTIMATOR_CHOICES, OBJECTIVES
from klppo.core.surrogates import SHAPES
from klppo.nn import ActorCritic, CategoricalHead, DiagGaussianHead
from klppo.nn.numpy import FastPathUnsupported, flat_weights, supports_fast_path
from klppo.nn.numpy.closed_form import loss_grads
from tests.rows import OneRow


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


#: the registry's token-level objectives (the fast path's domain); sequence-level ones need
#: sequence ids and are refused (test_the_fast_path_refuses_sequence_level_objectives)
TOKEN_LEVEL = {name: cls for name, cls in OBJECTIVES.items() if cls.level == "token"}


def registry_cases():
    """Every token-level objective of the core's registry x every shape it follows x every KL
    estimator it can penalise with; a new registry entry is covered without touching this
    file."""
    for name, cls in TOKEN_LEVEL.items():
        shapes = SHAPES if cls.shaped else ("clip",)
        estimators = KL_ESTIMATOR_CHOICES if cls.penalised else ("analytic",)
        for shape in shapes:
            for est in estimators:
                opts = {"shape": shape, "kl_estimator": est}
                if shape in ("linear_ramp", "sigmoid", "soft_min"):
                    opts["softness"] = 0.1
                if shape == "asymmetric":
                    opts["eps_high"] = 0.28
                yield pytest.param(name, opts, id=f"{name}-{shape}-{est}")


VALUE_LOSSES = [pytest.param({"value_loss": k, "value_clip": c}, id=f"{k}-clip{c}")
                for k in ("l2", "l1", "smooth_l1") for c in (0.2, None)]


@pytest.mark.parametrize("value_opts", VALUE_LOSSES)
@pytest.mark.parametrize("objective, opts", list(registry_cases()))
def test_generated_parity_per_sample_gradients(value_opts, objective, opts):
    """The generated parity table, loss level: the fast path's per-sample d loss / d (logp_new,
    value, entropy, analytic KL) and loss terms equal autograd's on ``PPOLoss``."""
    _loss_parity(objective, opts, value_opts, weighted=False)


@pytest.mark.parametrize("objective, opts", list(registry_cases()))
def test_generated_parity_with_sample_weights(objective, opts):
    """The same with per-sample weights on the objective (a stale rollout's correction; some
    0): ``loss_grads(weight=...)`` against ``PPOLoss(sample_weight=...)``."""
    _loss_parity(objective, opts, {}, weighted=True)


def _loss_parity(objective, opts, value_opts, weighted):
    ent = 0.01 if opts["kl_estimator"] in ("analytic", "k3") else 0.0
    norm = "minibatch" if objective == "unclipped" else "none"
    loss = PPOLoss(objective, ent_coef=ent, **opts, **value_opts, normalize_advantage=norm)
    g = torch.Generator().manual_seed(1)
    n = 64
    lo = -torch.rand(n, generator=g) * 3 - 0.1
    x = {"logp": lo + 0.4 * torch.randn(n, generator=g), "values": torch.randn(n, generator=g),
         "entropy": torch.rand(n, generator=g) + 0.5, "kl": torch.rand(n, generator=g) * 0.1}
    if OBJECTIVES[objective].needs_probabilities:  # log-probabilities of a discrete action
        x["logp"] = x["logp"].clamp(max=-1e-3)
    adv, ret = 3 * torch.randn(n, generator=g), torch.randn(n, generator=g)
    vold = x["values"] + 0.3 * torch.randn(n, generator=g)
    w = None
    if weighted:
        w = 2 * torch.rand(n, generator=g)
        w[::5] = 0.0
    leaves = {k: v.clone().requires_grad_(True) for k, v in x.items()}
    out = loss(leaves["logp"], lo, adv, leaves["values"], ret, vold, leaves["entropy"],
               leaves["kl"] if loss.needs_analytic_kl else None, 0.7, diagnostics=False,
               per_sample=True, sample_weight=w)
    auto = torch.autograd.grad(out["loss"], list(leaves.values()), allow_unused=True)
    terms, *fast, samples = loss_grads(loss, *(v.numpy() for v in (
        x["logp"], lo, adv, x["values"], ret, vold, x["entropy"], x["kl"])), 0.7,
        None if w is None else w.numpy())
    # the per-sample quantities the diagnostics reuse: the same names and numbers as torch's
    assert sorted(samples) == sorted(k[len("per_sample/"):] for k in out
                                     if k.startswith("per_sample/"))
    for k, v in samples.items():
        t = out[f"per_sample/{k}"]
        if t.dtype == torch.bool:
            assert np.array_equal(v, t.numpy()), k
        else:
            assert torch.allclose(torch.from_numpy(np.asarray(v, np.float32)), t, rtol=1e-5,
                                  atol=1e-6), k
    for name, a, f in zip(leaves, auto, fast):
        a = torch.zeros(n) if a is None else a
        f = torch.zeros(n) if f is None else torch.from_numpy(np.asarray(f, np.float32))
        # weighted: autograd takes w * (w A) and w * beta_t apart, so a killed sample's 0 is
        # a rounding residue there (1.5e-8 seen)
        assert torch.allclose(f, a, rtol=1e-5, atol=1e-7 if weighted else 1e-8), name
    for k in ("loss", "loss_objective", "loss_critic", "loss_entropy"):
        # (a mean of float32 terms of size ~1 summed in another order: 1e-6 with weights)
        assert terms[k] == pytest.approx(float(out[k]), rel=1e-5, abs=1e-6 if weighted else
                                         1e-7), k


def registry_objectives():
    for name, cls in TOKEN_LEVEL.items():
        for est in (("analytic", "k3") if cls.penalised else ("analytic",)):
            yield pytest.param(name, est, id=f"{name}-{est}")


@pytest.mark.parametrize("head", ["categorical", "gaussian"])
@pytest.mark.parametrize("objective, estimator", list(registry_objectives()))
def test_generated_parity_fast_step_vs_autograd(head, objective, estimator):
    """The generated parity table, network level: a whole fast step (numpy forward, the core's
    closed form, numpy backward, clip, Adam) equals autograd + torch Adam."""
    _check_parity(head, objective, 0.01, {"kl_estimator": estimator})


@pytest.mark.parametrize("head", ["categorical", "gaussian"])
@pytest.mark.parametrize("objective, ent_coef, opts", [
    ("clip", 0.05, {"value_loss": "l1"}), ("clip_kl", 0.0, {"kl_estimator": "abs",
                                                           "dual_clip": 3.0}),
])
def test_fast_step_matches_autograd_and_adam(head, objective, ent_coef, opts):
    _check_parity(head, objective, ent_coef, opts)


def _check_parity(head, objective, ent_coef, opts):
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    h = CategoricalHead(3) if head == "categorical" else DiagGaussianHead(2)
    agent = ActorCritic(5, h, log_std_init=-0.3)
    ref = copy.deepcopy(agent)
    loss = PPOLoss(objective, ent_coef=ent_coef, **opts)
    batches = make_batches(agent, h, rng, count=4, n=64, obs_dim=5)
    start = [q.detach().clone() for q in ref.parameters()]
    reference_steps(ref, loss, batches, beta=0.7)
    step = OneRow(agent, loss)
    for obs, act, old, lo, adv, ret, vold in batches:
        step.step_arrays(obs, act, old, lo, adv, ret, vold, 0.7)
    for (name, p), q in zip(agent.named_parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=2e-6, rtol=1e-5), name
    obs, _, old = batches[0][:3]
    with torch.no_grad():
        expect = h.kl(torch.from_numpy(old), agent.policy_params(torch.from_numpy(obs))).mean()
    assert step.policy_kl_arrays(obs, old) == pytest.approx(float(expect), rel=1e-4, abs=1e-7)
    assert all(not torch.equal(a, b) for a, b in zip(start, ref.parameters()))  # they moved


def test_flatten_keeps_values_and_makes_views():
    agent = ActorCritic(3, CategoricalHead(2))
    before = [p.detach().clone() for p in agent.parameters()]
    flat = flat_weights(agent).flat
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
    step = OneRow(agent, loss)
    for b in batches:
        step.step_arrays(*b, 0.0)
    for (name, p), q in zip(agent.named_parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=2e-6, rtol=1e-5), name


@pytest.mark.parametrize("objective", [n for n, c in OBJECTIVES.items() if c.level != "token"])
def test_the_fast_path_refuses_sequence_level_objectives(objective):
    """A sequence-level objective has no per-sample closed form: the numpy stack refuses it by name
    (the Gymnasium trainer refuses it earlier, in the config)."""
    agent = ActorCritic(4, CategoricalHead(2))
    with pytest.raises(FastPathUnsupported, match=f"{objective!r} has no closed-form"):
        OneRow(agent, PPOLoss(objective))


def _tilted_class():
    """A contributor's new objective with a value but no closed form: ``1.1 w A``."""
    from klppo.core.objectives import Objective, PolicyTerm

    class Tilted(Objective):
        name = "tilted"

        def term(self, ratio, logp_new, logp_old, advantage, kl, beta, want_beta=True):
            return PolicyTerm(1.1 * ratio * advantage, None, None)

    return Tilted


def test_an_objective_without_closed_form_cannot_reach_the_fast_path(monkeypatch, tmp_path,
                                                                    caplog):
    """Fail closed: the numpy stack refuses it, and the trainer falls back to torch (rollout and
    update) with a logged reason: the run equals a fast_path=False run exactly."""
    import dataclasses

    from klppo import rl

    monkeypatch.setitem(OBJECTIVES, "tilted", _tilted_class())
    agent = ActorCritic(4, CategoricalHead(2))
    with pytest.raises(FastPathUnsupported, match="'tilted' has no closed-form derivative"):
        OneRow(agent, PPOLoss("tilted"))
    cfg = dataclasses.replace(rl.preset("klip/cartpole"), objective="tilted", total_steps=1024,
                              tensorboard=False, out=str(tmp_path / "a"))
    a = rl.train(cfg)
    assert "numpy fast path off: objective 'tilted' has no closed-form derivative" in caplog.text
    b = rl.train(dataclasses.replace(cfg, fast_path=False, out=str(tmp_path / "b")))
    drop = ("sps", "time_collect", "time_update", "time_elapsed")
    assert [{k: v for k, v in m.items() if k not in drop} for m in a.metrics] == \
        [{k: v for k, v in m.items() if k not in drop} for m in b.metrics]


def test_fast_path_off_uses_no_numpy_runner(tmp_path):
    import dataclasses

    from klppo import rl
    from klppo.nn.runners import TorchRunner
    from klppo.rl.trainer import _Trainer

    cfg = dataclasses.replace(rl.preset("klip/cartpole"), fast_path=False, tensorboard=False)
    tr = _Trainer.alone(cfg, tmp_path)
    assert isinstance(tr.collector.runner, TorchRunner)
    assert not tr.learner.backend.fast
    tr.env.close()
