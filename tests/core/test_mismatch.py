"""Training-inference mismatch weights, by hand, and as PPOLoss's sample weights."""

import math

import pytest
import torch

from klppo.core.loss import PPOLoss
from klppo.core.mismatch import mismatch_stats, mismatch_weights

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
    with pytest.raises(ValueError, match="correction must be one of none, tis, mis, icepop"):
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


def test_m2po_masks_the_fewest_largest_squared_log_ratios():
    lr = torch.tensor([[0.5, 0.1, -0.3], [0.05, 0.0, 2.0]])
    m = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    # (log rho)^2 = .25 .01 .09 .0025 0: mean .0705 > .04; without .25: .0256 <= .04
    assert torch.equal(mismatch_weights(lr, m, "m2po"), torch.tensor([[0.0, 1, 1], [1, 1, 0]]))
    # tau .02: .25 and .09 go (mean .00417); tau 1: nothing goes
    assert torch.equal(mismatch_weights(lr, m, "m2po", upper=0.02),
                       torch.tensor([[0.0, 1, 0], [1, 1, 0]]))
    assert torch.equal(mismatch_weights(lr, m, "m2po", upper=1.0), m.float())
