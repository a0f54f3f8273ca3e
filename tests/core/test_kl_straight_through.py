"""verl's straight-through KL estimators ``k1+`` / ``k3+``: the value of k1 / k3, the gradient
of k2 (verl 0.5+ ``kl_penalty``: ``k2 - sg(k2) + sg(k)``)."""

import numpy as np
import pytest
import torch

from klppo.core.kl import ESTIMATOR_GRADS, ESTIMATORS


@pytest.mark.parametrize("name, value", [("k1+", "k1"), ("k3+", "k3")])
def test_the_value_is_k1_or_k3_and_the_gradient_k2s(name, value):
    log_r = torch.linspace(-3, 3, 25, dtype=torch.float64, requires_grad=True)
    got = ESTIMATORS[name](log_r)
    assert torch.equal(got.detach(), ESTIMATORS[value](log_r).detach())
    (grad,) = torch.autograd.grad(got.sum(), log_r)
    assert torch.allclose(grad, log_r.detach(), atol=1e-15)  # d(0.5 x^2)/dx = x, by hand
    assert torch.allclose(ESTIMATOR_GRADS[name](log_r.detach()), grad)
    # the numpy fast path: the value, its gradient from ESTIMATOR_GRADS
    x = np.linspace(-3, 3, 25)
    np.testing.assert_array_equal(ESTIMATORS[name](x), ESTIMATORS[value](x))
    np.testing.assert_allclose(ESTIMATOR_GRADS[name](x), x)


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_fixed_beta_penalty_trains_exactly_as_k2_with_either(tmp_path, fast_path):
    """With a fixed beta only the gradient of the penalty moves the policy: k1+ and k3+ train
    exactly as k2 (every return equal), in the numpy fast path and in torch."""
    import dataclasses

    from klppo import rl

    base = rl.preset("klip/cartpole")

    def returns(est):
        cfg = dataclasses.replace(base, objective="kl_penalty", total_steps=2048,
                                  tensorboard=False, fast_path=fast_path,
                                  out=str(tmp_path / f"{est}-{fast_path}"),
                                  ppo=dataclasses.replace(base.ppo, kl_estimator=est))
        return [m["episode_return_mean"] for m in rl.train(cfg).metrics]

    want = returns("k2")
    assert returns("k1+") == want and returns("k3+") == want
    assert returns("k3") != want  # the penalty's gradient matters here
