"""klppo's KLipPPOLoss against TorchRL's ClipPPOLoss: same gradients, values and keys."""

import inspect

import pytest

pytest.importorskip("torchrl")

import torch  # noqa: E402
from torchrl.objectives import ClipPPOLoss  # noqa: E402

from klppo.integrations.torchrl import KLipPPOLoss  # noqa: E402
from klppo.integrations.torchrl.klip import DIAGNOSTIC_KEYS  # noqa: E402
from tests.integrations.torchrl_setup import (  # noqa: E402
    KINDS,
    collect,
    make_actor_critic,
    max_abs_diff,
    perturb,
    total,
    twins,
)


def grads_of_both(kind, batch, options=None, ours_options=None, scale=0.4):
    """One forward and backward of each loss on twin networks and the same batch."""
    options = options or {}
    (a1, c1), (a2, c2) = twins(kind)
    data = collect(a1, c1, batch, seed=0)
    perturb(a1, scale, seed=1)
    perturb(a2, scale, seed=1)
    ref = ClipPPOLoss(a1, c1, **options)
    ours = KLipPPOLoss(a2, c2, **options, **(ours_options or {}))
    outs = []
    for loss in (ref, ours):
        torch.manual_seed(7)  # TanhNormal's entropy is sampled
        out = loss(data.clone())
        total(out).backward()
        outs.append(out)
    pairs = [(p1.grad, p2.grad) for p1, p2 in zip(ref.parameters(), ours.parameters(),
                                                  strict=True)]
    return outs, pairs


@pytest.mark.parametrize("kind", KINDS)
def test_gradients_bit_exact_with_a_power_of_two_batch(kind):
    (out1, out2), pairs = grads_of_both(kind, 256)
    assert out2["frac_kill"] > 0.05  # the clip acts on a good share of the batch
    assert all(g1 is not None and torch.equal(g1, g2) for g1, g2 in pairs)


def test_gradients_bit_exact_with_asymmetric_band_and_options():
    options = dict(clip_epsilon=(0.1, 0.25), entropy_coeff=0.03, critic_coeff=0.5,
                   loss_critic_type="l2", normalize_advantage=True, clip_value=0.3)
    (out1, out2), pairs = grads_of_both("normal", 128, options)
    assert out2["frac_kill"] > 0.05
    assert all(torch.equal(g1, g2) for g1, g2 in pairs)


@pytest.mark.parametrize("kind", ["categorical", "normal"])
def test_gradients_close_with_another_batch_size(kind):
    (_, _), pairs = grads_of_both(kind, 300)
    for g1, g2 in pairs:
        torch.testing.assert_close(g2, g1, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_values_and_keys_match_clip_ppo_loss(reduction):
    (out1, out2), _ = grads_of_both("normal", 64, dict(reduction=reduction))
    assert set(out2.keys()) == set(out1.keys()) | set(DIAGNOSTIC_KEYS)
    for key in out1.keys():
        if key == "loss_objective":  # clip value: band edge 1 + eps vs exp(log1p(eps))
            torch.testing.assert_close(out2[key], out1[key], rtol=1e-6, atol=1e-7)
        else:
            assert torch.equal(out1[key], out2[key]), key
    for key in DIAGNOSTIC_KEYS:
        assert out2[key].shape == () and not out2[key].requires_grad
    assert float(out2["frac_in"] + out2["frac_pass"] + out2["frac_kill"]) == pytest.approx(1.0)


def test_training_stays_bit_identical():
    (a1, c1), (a2, c2) = twins("categorical")
    ref, ours = ClipPPOLoss(a1, c1), KLipPPOLoss(a2, c2)
    opt1 = torch.optim.Adam(ref.parameters(), lr=0.02)
    opt2 = torch.optim.Adam(ours.parameters(), lr=0.02)
    kills = []
    for step in range(30):
        if step % 10 == 0:
            data = collect(a1, c1, 64, seed=step)
        for opt, loss in ((opt1, ref), (opt2, ours)):
            out = loss(data.clone())
            opt.zero_grad()
            total(out).backward()
            opt.step()
        kills.append(float(out["frac_kill"]))
    assert max(kills) > 0.1
    assert all(torch.equal(p1, p2) for p1, p2 in zip(ref.parameters(), ours.parameters()))


def test_other_shapes_change_the_gradient_not_the_value():
    (out1, out2), pairs = grads_of_both("normal", 64, ours_options=dict(
        shape="sigmoid", softness=0.1))
    torch.testing.assert_close(out2["loss_objective"], out1["loss_objective"])
    assert not all(torch.equal(g1, g2) for g1, g2 in pairs)
    assert out2["beta_t_q50"] > 0  # a soft shape puts beta_t on more samples


def test_constructor_mirrors_clip_ppo_loss_and_refuses_what_it_cannot_serve():
    ours = inspect.signature(KLipPPOLoss).parameters
    theirs = inspect.signature(ClipPPOLoss).parameters
    for name, p in theirs.items():
        assert ours[name].default == p.default and ours[name].kind == p.kind, name
    assert set(ours) - set(theirs) == {"shape", "softness", "softness_low", "softness_high",
                                       "dual_clip", "diagnostics"}
    actor, critic = make_actor_critic("categorical")
    with pytest.raises(NotImplementedError, match="delay_actor"):
        KLipPPOLoss(actor, critic, delay_actor=True)
    with pytest.raises(NotImplementedError, match="max_importance_ratio"):
        KLipPPOLoss(actor, critic, max_importance_ratio=10.0)
    with pytest.raises(ValueError, match="softness"):
        KLipPPOLoss(actor, critic, shape="linear_ramp")
    with pytest.raises(ValueError, match="shape"):
        KLipPPOLoss(actor, critic, shape="nope")
    with pytest.raises(TypeError, match="critic_coeff"):
        KLipPPOLoss(actor, critic, critic_coef=0.5)
    loss = KLipPPOLoss(actor, critic, clip_epsilon=0.1)
    loss.clip_epsilon = 0.3  # TorchRL's schedulable buffer is the band
    assert loss.band.eps == pytest.approx(0.3)


def test_largest_difference_report():
    """Prints the largest differences seen against ClipPPOLoss (``-s`` shows them)."""
    worst = {"grad_pow2": 0.0, "grad_300": 0.0, "loss_objective": 0.0, "other_losses": 0.0}
    for kind in KINDS:
        for batch, key in ((256, "grad_pow2"), (300, "grad_300")):
            (out1, out2), pairs = grads_of_both(kind, batch)
            worst[key] = max(worst[key], *(max_abs_diff(g1, g2) for g1, g2 in pairs))
            worst["loss_objective"] = max(worst["loss_objective"], max_abs_diff(
                out1["loss_objective"], out2["loss_objective"]))
            worst["other_losses"] = max(worst["other_losses"], *(
                max_abs_diff(out1[k], out2[k]) for k in out1.keys()
                if k.startswith("loss_") and k != "loss_objective"))
    print(f"\nKLipPPOLoss vs ClipPPOLoss, largest |difference|: {worst}")
    assert worst["grad_pow2"] == 0.0 and worst["other_losses"] == 0.0
