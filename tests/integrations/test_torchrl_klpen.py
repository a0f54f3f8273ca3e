"""klppo's KLPENPPOLoss against TorchRL's own class, on the same actors, data and seeds."""

import inspect

import pytest

pytest.importorskip("torchrl")

import torch  # noqa: E402
from torchrl.objectives import KLPENPPOLoss as TorchRLKLPEN  # noqa: E402

from klppo.core.controllers import make_controller  # noqa: E402
from klppo.integrations.torchrl import KLPENPPOLoss  # noqa: E402
from klppo.integrations.torchrl import klpen as klpen_module  # noqa: E402
from tests.integrations.torchrl_setup import (  # noqa: E402
    KINDS,
    collect,
    make_actor_critic,
    max_abs_diff,
    perturb,
    total,
    twins,
)

#: non-default TorchRL options, with factors that float32 cannot hold exactly (1.3, 0.7)
OPTIONS = dict(dtarg=0.02, beta=0.3, increment=1.3, decrement=0.7, entropy_coeff=0.05,
               critic_coeff=0.7, loss_critic_type="l2", normalize_advantage=True,
               clip_value=0.5)


def run_pair(kind, steps=40, batch=64, lr=0.02, recollect=10, options=None, monkeypatch=None):
    """Train twin networks, one with each loss (same data, same seeds), and return the
    per-step outputs and betas; recollecting every ``recollect`` steps resets the KL, so beta
    goes down as well as up."""
    options = options or {}
    (a1, c1), (a2, c2) = twins(kind)
    ref, ours = TorchRLKLPEN(a1, c1, **options), KLPENPPOLoss(a2, c2, **options)
    opt1 = torch.optim.Adam(ref.parameters(), lr=lr)
    opt2 = torch.optim.Adam(ours.parameters(), lr=lr)
    log = []
    for step in range(steps):
        if step % recollect == 0:
            data = collect(a1, c1, batch, seed=step)
        torch.manual_seed(1000 + step)
        out1 = ref(data.clone())
        torch.manual_seed(1000 + step)
        out2 = ours(data.clone())
        log.append((out1, out2, ref.beta.clone(), ours.beta.clone()))
        for opt, out in ((opt1, out1), (opt2, out2)):
            opt.zero_grad()
            total(out).backward()
            opt.step()
    params = list(zip(ref.parameters(), ours.parameters(), strict=True))
    return log, params


@pytest.mark.parametrize("kind", KINDS)
def test_same_losses_grads_and_beta_trajectory_as_torchrl(kind):
    log, params = run_pair(kind)
    betas = [float(b1) for _, _, b1, _ in log]
    assert max(betas) > 1.0 and min(betas) < max(betas) / 2, betas  # beta went up and down
    for out1, out2, b1, b2 in log:
        assert sorted(out1.keys()) == sorted(out2.keys())
        for key in out1.keys():
            assert torch.equal(out1[key], out2[key]), key
        assert torch.equal(b1, b2)
    # the parameters after 40 Adam steps: the gradients were equal at every step
    assert all(torch.equal(p1, p2) for p1, p2 in params)


def test_non_default_options_and_inexact_factors():
    log, params = run_pair("normal", options=OPTIONS)
    changes = {round(float(b2) / float(b1), 6) for (_, _, b1, _), (_, _, b2, _)
               in zip(log, log[1:])}
    assert {1.3, 0.7} <= changes, changes  # both factors were applied
    for out1, out2, b1, b2 in log:
        assert all(torch.equal(out1[k], out2[k]) for k in out1.keys())
        assert torch.equal(b1, b2)
    assert all(torch.equal(p1, p2) for p1, p2 in params)


@pytest.mark.parametrize("samples_mc_kl", [1, 3])
def test_monte_carlo_kl_of_truncated_normal_matches_torchrl(samples_mc_kl):
    log, _ = run_pair("truncated_normal", steps=12, options=dict(samples_mc_kl=samples_mc_kl))
    for out1, out2, b1, b2 in log:
        assert torch.equal(out1["kl"], out2["kl"]) and torch.equal(b1, b2)


def test_monte_carlo_kl_of_tanh_normal_scores_the_same_draw(monkeypatch):
    """TorchRL has a closed form for TanhNormal (through the tanh); forcing both losses onto
    the sampled path exercises TanhNormal.sample_and_log_prob in klppo's monte_carlo_kl."""
    import torchrl.objectives.ppo as ppo

    monkeypatch.setattr(ppo, "has_analytic_kl", lambda p, q: False)
    monkeypatch.setattr(klpen_module, "has_analytic_kl", lambda p, q: False)
    log, params = run_pair("tanh_normal", steps=12, options=dict(samples_mc_kl=2))
    for out1, out2, b1, b2 in log:
        assert all(torch.equal(out1[k], out2[k]) for k in out1.keys())
        assert torch.equal(b1, b2)
    assert all(torch.equal(p1, p2) for p1, p2 in params)


def test_beta_outside_forward_with_any_controller():
    actor, critic = make_actor_critic("normal")
    data = collect(actor, critic, 32, seed=0)
    perturb(actor, 0.3, seed=1)
    loss = KLPENPPOLoss(actor, critic, update_beta_in_forward=False)
    out = loss(data)
    assert float(loss.beta) == 1.0  # forward did not touch beta
    twin = make_controller("step", preset="torchrl")
    assert loss.update_beta(out["kl"].mean()) == twin.update(out["kl"].mean().item())
    pid = make_controller("pid", beta=0.5, target=0.01, kp=1.0, ki=5.0)
    loss.controller = pid
    assert float(loss.beta) == 0.5 and loss.dtarg == 0.01
    twin = make_controller("pid", beta=0.5, target=0.01, kp=1.0, ki=5.0)
    for kl in (0.03, 0.002, 0.02):
        assert loss.update_beta(kl) == pytest.approx(twin.update(kl), rel=1e-6)
    loss.reset()
    assert float(loss.beta) == 0.5 and pid.num_updates == 0


def test_snapshot_beta_gives_value_and_gradient_the_same_beta():
    """update_beta_in_forward=False: an update between forward and backward does not leak into
    the gradient (TorchRL's in-forward update does leak: its backward sees the new beta)."""
    grads = []
    for update in (False, True):
        actor, critic = make_actor_critic("normal")
        data = collect(actor, critic, 32, seed=0)
        perturb(actor, 0.3, seed=1)
        loss = KLPENPPOLoss(actor, critic, update_beta_in_forward=False, entropy_bonus=False)
        out = loss(data)
        if update:
            loss.update_beta(1.0)  # far above target: beta doubles
            assert float(loss.beta) == 2.0
        out["loss_objective"].backward()
        grads.append([p.grad.clone() for p in actor.parameters()])
    assert all(torch.equal(g1, g2) for g1, g2 in zip(*grads))


def test_reset_and_scheduled_beta_are_respected():
    actor, critic = make_actor_critic("categorical")
    loss = KLPENPPOLoss(actor, critic, beta=0.25)
    loss.update_beta(1.0)
    assert float(loss.beta) == 0.5
    loss.beta = 4.0  # TorchRL's schedulable buffer: the controller starts from it
    assert loss.update_beta(0.0) == 2.0
    loss.reset()
    assert float(loss.beta) == 0.25


def test_constructor_mirrors_torchrl():
    ours = inspect.signature(KLPENPPOLoss).parameters
    theirs = inspect.signature(TorchRLKLPEN).parameters
    for name, p in theirs.items():
        assert ours[name].default == p.default and ours[name].kind == p.kind, name
    assert set(ours) - set(theirs) == {"controller", "update_beta_in_forward", "composite_kl"}
    actor, critic = make_actor_critic("categorical")
    for bad in (dict(entropy_coef=0.1), dict(critic_coef=0.1), dict(increment=0.5)):
        with pytest.raises((TypeError, ValueError)) as theirs_err:
            TorchRLKLPEN(actor, critic, **bad)
        with pytest.raises(theirs_err.type):
            KLPENPPOLoss(actor, critic, **bad)
    with pytest.raises(ValueError, match="controller= replaces"):
        KLPENPPOLoss(actor, critic, beta=2.0, controller=make_controller("fixed", beta=1.0))
    for n in (0, -1, 1.5, True):  # refused at construction, not deep inside the first KL
        with pytest.raises(ValueError, match=rf"samples_mc_kl={n!r}: must be an integer >= 1"):
            KLPENPPOLoss(actor, critic, samples_mc_kl=n, composite_kl="torchrl")
    loss = KLPENPPOLoss(actor, critic, dtarg=0.05, beta=0.2, increment=3, decrement=0.25)
    c = loss.controller
    assert (c.target, c.value, c.increase, c.decrease, c.hi_band, c.lo_band) == (
        0.05, pytest.approx(0.2), 3.0, 0.25, 1.5, 1.5)


def test_largest_difference_report():
    """Not a check beyond the others: prints the largest differences seen (``-s`` shows it)."""
    worst = {"loss": 0.0, "beta": 0.0}
    for kind in KINDS:
        log, _ = run_pair(kind, steps=20)
        for out1, out2, b1, b2 in log:
            worst["loss"] = max(worst["loss"], *(max_abs_diff(out1[k], out2[k])
                                                 for k in out1.keys() if k.startswith("loss_")))
            worst["beta"] = max(worst["beta"], max_abs_diff(b1, b2))
    print(f"\nKLPENPPOLoss vs TorchRL, largest |difference|: {worst}")
    assert worst == {"loss": 0.0, "beta": 0.0}


def test_torchrl_backward_uses_the_beta_after_its_update():
    """Pins the TorchRL behaviour the default mode reproduces: ``self.beta.data *= ...`` after
    the penalty is built, so backward multiplies the KL's gradient by the *new* beta."""
    grads = {}
    for name, beta, loss_cls, opts in (
        ("torchrl", 1.0, TorchRLKLPEN, {}),
        ("old_beta", 1.0, KLPENPPOLoss, dict(update_beta_in_forward=False)),
        ("new_beta", 2.0, KLPENPPOLoss, dict(update_beta_in_forward=False)),
    ):
        actor, critic = make_actor_critic("normal")
        data = collect(actor, critic, 32, seed=0)
        perturb(actor, 0.3, seed=1)
        loss = loss_cls(actor, critic, beta=beta, entropy_bonus=False, **opts)
        loss(data)["loss_objective"].backward()
        if name == "torchrl":
            assert float(loss.beta) == 2.0  # the KL was above 1.5 dtarg: beta doubled
        grads[name] = [p.grad for p in actor.parameters()]
    same = lambda a, b: all(torch.equal(x, y) for x, y in zip(grads[a], grads[b]))
    assert same("torchrl", "new_beta") and not same("torchrl", "old_beta")
