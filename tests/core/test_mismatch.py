"""Training-inference mismatch weights, by hand, and as PPOLoss's sample weights."""

import math

import pytest
import torch

from klppo.core.loss import PPOLoss
from klppo.core.mismatch import bounds_problem, mismatch_stats, mismatch_weights

LOG_RATIO = torch.tensor([[math.log(3.0), math.log(0.4), 0.1], [math.log(1.5), math.log(1.2),
                                                                  9.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)


def test_each_correction_by_hand():
    r = LOG_RATIO.exp()
    tis = mismatch_weights(LOG_RATIO, MASK, "tis")
    assert torch.allclose(tis, torch.tensor([[2.0, 0.4, r[0, 2]], [1.5, 1.2, 0.0]]))
    ice = mismatch_weights(LOG_RATIO, MASK, "icepop")
    assert torch.allclose(ice, torch.tensor([[3.0, 0.0, r[0, 2]], [1.5, 1.2, 0.0]]))
    mis = mismatch_weights(LOG_RATIO, MASK, "mis")  # response ratios 1.326 and 1.8 (<= 2)
    assert torch.allclose(mis, torch.tensor([[3 * 0.4 * r[0, 2]] * 3, [1.8, 1.8, 0.0]]))
    strict = mismatch_weights(LOG_RATIO, MASK, "mis", upper=1.5)
    assert torch.allclose(strict, torch.tensor([[3 * 0.4 * r[0, 2]] * 3, [0.0, 0.0, 0.0]]))
    assert torch.equal(mismatch_weights(LOG_RATIO, MASK, "none"), MASK.float())
    with pytest.raises(ValueError, match="must be one of none, tis, seq_tis, mis, icepop, m2po"):
        mismatch_weights(LOG_RATIO, MASK, "vtrace")


def test_stats_measure_the_mismatch_on_the_valid_tokens():
    w = mismatch_weights(LOG_RATIO, MASK, "icepop")
    s = mismatch_stats(LOG_RATIO, MASK, w)
    lr = LOG_RATIO[MASK].double()
    assert s["mismatch_kl_k3"] == pytest.approx(float((lr.exp() - 1 - lr).mean()))
    assert s["mismatch_ratio_max"] == pytest.approx(3.0)
    assert s["mismatch_zeroed"] == pytest.approx(1 / 5)


def test_sample_weights_scale_each_samples_objective_gradient():
    g = torch.Generator().manual_seed(0)
    lp_old = -torch.rand(8, generator=g)
    lp = (lp_old + 0.3 * torch.randn(8, generator=g)).requires_grad_(True)
    adv = torch.randn(8, generator=g)
    w = torch.tensor([1.0, 0.0, 2.0, 0.5, 1.0, 1.0, 0.0, 3.0])
    loss = PPOLoss("clip", normalize_advantage="none")
    (g_w,) = torch.autograd.grad(loss(lp, lp_old, adv, sample_weight=w)["loss"], lp)
    (g_1,) = torch.autograd.grad(loss(lp, lp_old, adv)["loss"], lp)
    assert torch.allclose(g_w, w * g_1)


def test_m2po_masks_the_fewest_largest_squared_log_ratios_and_keeps_the_behaviour_weight():
    lr = torch.tensor([[0.5, 0.1, -0.3], [0.05, 0.0, 2.0]])
    m = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    rho = torch.where(m, lr.exp(), torch.zeros(()))
    # (log rho)^2 = .25 .01 .09 .0025 0: mean .0705 > .04; without .25: .0256 <= .04
    kept = torch.tensor([[0.0, 1, 1], [1, 1, 0]])
    assert torch.allclose(mismatch_weights(lr, m, "m2po"), kept * rho)
    # tau .02: .25 and .09 go (mean .00417); tau 1: nothing goes
    assert torch.allclose(mismatch_weights(lr, m, "m2po", upper=0.02),
                          torch.tensor([[0.0, 1, 0], [1, 1, 0]]) * rho)
    assert torch.allclose(mismatch_weights(lr, m, "m2po", upper=1.0), rho)
    # AReaL's rejection: rho = e^.1 = 1.105 > 1.1 goes too, e^.05 = 1.051 stays
    assert torch.allclose(mismatch_weights(lr, m, "m2po", upper=1.0, reject=1.1),
                          torch.tensor([[0.0, 0, 1], [1, 1, 0]]) * rho)


def test_seq_tis_and_two_sided_mis_by_hand():
    r = LOG_RATIO.exp()
    seq = torch.tensor([3 * 0.4 * float(r[0, 2]), 1.8])  # the responses' ratios
    assert torch.allclose(mismatch_weights(LOG_RATIO, MASK, "seq_tis"),
                          torch.stack([seq[0].expand(3), torch.tensor([1.8, 1.8, 0])]))
    assert torch.allclose(mismatch_weights(LOG_RATIO, MASK, "seq_tis", upper=1.5),
                          torch.tensor([[seq[0]] * 3, [1.5, 1.5, 0.0]]))
    two = mismatch_weights(LOG_RATIO, MASK, "mis", lower=1.5)  # 1.326 < 1.5: masked
    assert torch.allclose(two, torch.tensor([[0.0] * 3, [1.8, 1.8, 0.0]]))


def test_bounds_each_correction_reads():
    assert bounds_problem("mis", None, 0.5) is None
    assert bounds_problem("mis", None, 3.0) == ("lower", 3.0, "must be below the upper bound 2.0")
    assert bounds_problem("tis", None, 0.5)[0] == "lower"
    assert bounds_problem("tis", None, None, reject=5.0)[0] == "reject"
    assert bounds_problem("m2po", None, None, reject=5.0) is None
    assert bounds_problem("m2po", None, None, reject=1.0)[0] == "reject"
    assert bounds_problem("none", None, None, reject=5.0)[0] == "reject"


# ---------------------------------------------------------------- gradients, by enumeration
# A 3-armed bandit: pi_theta = softmax(theta), proximal policy pi_prox = pi_theta at theta0
# (the current policy before the update), the stale behaviour policy mu sampled the arms. The
# data set holds arm a exactly 10 * mu(a) times, so a mean over it is E_mu exactly.
MU = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
THETA0 = torch.tensor([0.4, -0.2, 0.1], dtype=torch.float64)
ADV = torch.tensor([1.0, -1.5, 0.7], dtype=torch.float64)
ARMS = torch.repeat_interleave(torch.arange(3), (10 * MU).round().long())


def _bandit_gradient(correction: str | None, **bounds) -> torch.Tensor:
    """d/dtheta at theta0 of the weighted unclipped objective, over the enumerated data."""
    theta = THETA0.clone().requires_grad_(True)
    logp = torch.log_softmax(theta, 0)[ARMS]
    logp_prox = torch.log_softmax(THETA0, 0)[ARMS]
    w = None
    if correction is not None:
        log_ratio = (logp_prox - MU.log()[ARMS])[:, None]
        w = mismatch_weights(log_ratio, torch.ones_like(log_ratio, dtype=torch.bool),
                             correction, **bounds)[:, 0]
    loss = PPOLoss("unclipped", normalize_advantage="none", vf_coef=0.0)
    out = loss(logp, logp_prox, ADV[ARMS], sample_weight=w)["loss_objective"]
    (g,) = torch.autograd.grad(-out, theta)
    return g


def _true_gradient() -> torch.Tensor:
    theta = THETA0.clone().requires_grad_(True)
    (g,) = torch.autograd.grad((torch.softmax(theta, 0) * ADV).sum(), theta)
    return g


@pytest.mark.parametrize("correction, bounds", [
    ("tis", {"upper": 100.0}), ("seq_tis", {"upper": 100.0}), ("mis", {"upper": 100.0}),
    ("icepop", {"lower": 0.01, "upper": 100.0}), ("m2po", {"upper": 100.0}),
    ("m2po", {"upper": 100.0, "reject": 100.0})])
def test_each_correction_that_binds_nothing_gives_the_on_policy_gradient(correction, bounds):
    assert torch.allclose(_bandit_gradient(correction, **bounds), _true_gradient(), atol=1e-12)


def test_without_a_correction_the_stale_gradient_is_biased():
    assert not torch.allclose(_bandit_gradient("none"), _true_gradient(), atol=1e-3)
    assert torch.allclose(_bandit_gradient("none"), _bandit_gradient(None))


def test_a_binding_bound_weights_exactly_as_its_definition():
    rho = torch.softmax(THETA0, 0) / MU  # 0.59, 0.59, 2.36 (rounded)
    pi0 = torch.softmax(THETA0, 0)
    for correction, weight in [("tis", rho.clamp(max=2.0)),
                               ("m2po", torch.where(rho <= 2.0, rho, torch.zeros(()))),
                               ("icepop", torch.where(rho >= 0.6, rho, torch.zeros(())))]:
        bounds = {"m2po": {"upper": 100.0, "reject": 2.0}, "icepop": {"lower": 0.6}}.get(
            correction, {})
        theta = THETA0.clone().requires_grad_(True)
        pi = torch.softmax(theta, 0)
        (expect,) = torch.autograd.grad((MU * weight * pi / pi0 * ADV).sum(), theta)
        assert torch.allclose(_bandit_gradient(correction, **bounds), expect, atol=1e-12)


def test_sequence_level_weights_are_exact_on_sequences_where_token_weights_are_not():
    """Two tokens, two arms each, drawn independently; the advantage is the response's. The
    response ratio (seq_tis, mis) gives the on-policy gradient, the token ratio does not."""
    mu = torch.tensor([0.25, 0.75], dtype=torch.float64)
    th0 = torch.tensor([[0.3, -0.3], [-0.5, 0.2]], dtype=torch.float64)  # per position
    adv = torch.tensor([[1.0, -2.0], [0.5, 1.5]], dtype=torch.float64)  # A(y1, y2)
    pairs = [(a, b) for a in range(2) for b in range(2)]
    counts = [int(round(16 * float(mu[a] * mu[b]))) for a, b in pairs]
    ys = torch.tensor([p for p, n in zip(pairs, counts) for _ in range(n)])  # [16, 2]

    def grad(correction):
        th = th0.clone().requires_grad_(True)
        logp = torch.log_softmax(th, -1).gather(1, ys.T).T  # [N, 2]
        logp0 = torch.log_softmax(th0, -1).gather(1, ys.T).T
        w = mismatch_weights(logp0 - mu.log()[ys], torch.ones_like(logp0, dtype=torch.bool),
                             correction, upper=100.0)
        a = adv[ys[:, 0], ys[:, 1]][:, None].expand_as(logp)
        (g,) = torch.autograd.grad((w * torch.exp(logp - logp0) * a).mean(0).sum(), th)
        return g

    th = th0.clone().requires_grad_(True)
    pi = torch.softmax(th, -1)
    (true,) = torch.autograd.grad((pi[0][:, None] * pi[1][None, :] * adv).sum(), th)
    assert torch.allclose(grad("seq_tis"), true, atol=1e-12)
    assert torch.allclose(grad("mis"), true, atol=1e-12)
    assert not torch.allclose(grad("tis"), true, atol=1e-3)
