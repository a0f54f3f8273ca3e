import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import distributions as D

from klppo.core import kl as K

P = [0.5, 0.3, 0.2]
Q = [0.2, 0.5, 0.3]


def hand_kl(p, q):
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))


def test_sampled_estimators_hand_values():
    # one sample x drawn from q with q(x) = 0.5 and p(x) = 0.2: log r = log(0.2 / 0.5)
    lq = torch.tensor([math.log(0.5)], dtype=torch.float64)
    lp = torch.tensor([math.log(0.2)], dtype=torch.float64)
    log_r = math.log(0.4)
    assert K.sampled_kl(lq, lp, "k1").item() == pytest.approx(-log_r, abs=1e-15)
    assert K.sampled_kl(lq, lp, "k2").item() == pytest.approx(0.5 * log_r**2, abs=1e-15)
    assert K.sampled_kl(lq, lp, "k3").item() == pytest.approx(0.4 - 1 - log_r, abs=1e-15)
    assert K.sampled_kl(lq, lp, "abs").item() == pytest.approx(abs(log_r), abs=1e-15)


def test_analytic_categorical_matches_hand_computation():
    p, q = D.Categorical(probs=torch.tensor(P, dtype=torch.float64)), D.Categorical(
        probs=torch.tensor(Q, dtype=torch.float64)
    )
    assert K.analytic_kl(p, q).item() == pytest.approx(hand_kl(P, Q), rel=1e-12)
    assert K.analytic_kl(q, p).item() == pytest.approx(hand_kl(Q, P), rel=1e-12)


def test_exact_expectation_of_k1_k3_is_the_kl_and_peer_bug_is_biased():
    # enumerate the 3 outcomes of pi exactly: E_pi[k] for the reference KL(pi || ref)
    pi, ref = torch.tensor(P, dtype=torch.float64), torch.tensor(Q, dtype=torch.float64)
    true = hand_kl(P, Q)
    for est in ("k1", "k3"):
        e = (pi * K.sampled_kl(pi.log(), ref.log(), est)).sum().item()
        assert e == pytest.approx(true, rel=1e-12)
    # the peer bug: exp(d) - 1 - d with d = logp - logp_ref on samples from pi
    d = pi.log() - ref.log()
    flipped = (pi * (torch.expm1(d) - d)).sum().item()
    chi2 = (pi * (pi / ref - 1)).sum().item()
    assert flipped == pytest.approx(chi2 - true, rel=1e-12)
    assert abs(flipped - true) > 0.5 * true  # badly biased, not a rounding matter


def test_zero_at_identical_policies():
    lp = torch.randn(100)
    for est in ("k1", "k2", "k3", "abs"):
        assert torch.equal(K.sampled_kl(lp, lp.clone(), est), torch.zeros(100))
    d = D.Categorical(logits=torch.randn(5, 4))
    assert torch.allclose(K.analytic_kl(d, d), torch.zeros(5), atol=1e-7)
    logits = torch.randn(2, 7, 11)
    assert torch.allclose(K.full_kl(logits, logits.clone()), torch.zeros(2, 7), atol=1e-6)


LOGP = st.floats(-20, 20) | st.floats(-20, 20, width=32)  # the latter reaches float32 subnormals


@given(st.lists(LOGP, min_size=1, max_size=30), st.lists(LOGP, min_size=1, max_size=30),
       st.sampled_from([torch.float32, torch.float64]))
def test_k2_k3_abs_nonnegative(a, b, dtype):
    """>= 0 holds in float32 and float64 too: k2 and abs trivially; k3 = expm1(x) - x since
    expm1(x) >= x exactly and a faithfully rounded expm1 (torch's is) never drops below the float
    x (for tiny or subnormal x it returns x itself: 0). |x| <= 40: nothing overflows."""
    n = min(len(a), len(b))
    la, lb = torch.tensor(a[:n], dtype=dtype), torch.tensor(b[:n], dtype=dtype)
    for est in ("k2", "k3", "abs"):
        assert bool((K.sampled_kl(la, lb, est) >= 0).all())


def test_monte_carlo_mean_matches_analytic_categorical():
    gen = torch.Generator().manual_seed(0)
    q = torch.tensor(P, dtype=torch.float64)
    p = torch.tensor(Q, dtype=torch.float64)
    n = 200_000
    x = torch.multinomial(q, n, replacement=True, generator=gen)
    true = hand_kl(P, Q)  # KL(q || p) with q = P
    for est in ("k1", "k3"):
        v = K.sampled_kl(q.log()[x], p.log()[x], est)
        se = v.std().item() / math.sqrt(n)
        assert abs(v.mean().item() - true) < 4 * se, est  # 4 standard errors


@pytest.mark.parametrize(
    "mu, true_kl, expect",
    [
        (0.1, 0.005, {"k1": (0.0, 20.0), "k2": (0.002, 1.42), "k3": (0.0, 1.42)}),
        (1.0, 0.5, {"k1": (0.0, 2.0), "k2": (0.25, 1.73), "k3": (0.0, 1.70)}),
    ],
)
def test_schulman_table(mu, true_kl, expect):
    """q = N(0,1), p = N(mu,1): bias/true and std/true of each estimator, 10^6 samples.

    Std/true within 10% relative. Bias/true within max(10% of the table value, 4 Monte Carlo
    standard errors): a bias of 0.002 * true cannot be resolved to 10% with 10^6 samples
    (its standard error is 0.0014 * true), so there the noise bound is the honest one.
    """
    gen = torch.Generator().manual_seed(1)
    n = 1_000_000
    x = torch.randn(n, generator=gen, dtype=torch.float64)
    f64 = dict(dtype=torch.float64)
    q = D.Normal(torch.tensor(0.0, **f64), torch.tensor(1.0, **f64))
    p = D.Normal(torch.tensor(mu, **f64), torch.tensor(1.0, **f64))
    assert K.analytic_kl(q, p).item() == pytest.approx(true_kl, rel=1e-12)
    for est, (bias, std) in expect.items():
        v = K.sampled_kl(q.log_prob(x), p.log_prob(x), est) / true_kl
        se = v.std().item() / math.sqrt(n)
        assert abs((v.mean().item() - 1) - bias) <= max(0.1 * bias, 4 * se), est
        assert v.std().item() == pytest.approx(std, rel=0.1), est


def test_independent_normal_sums_over_action_dims():
    mu1, mu2 = torch.randn(4, 3), torch.randn(4, 3)
    s1, s2 = torch.rand(4, 3) + 0.5, torch.rand(4, 3) + 0.5
    p = D.Independent(D.Normal(mu1, s1), 1)
    q = D.Independent(D.Normal(mu2, s2), 1)
    hand = (torch.log(s2 / s1) + (s1**2 + (mu1 - mu2) ** 2) / (2 * s2**2) - 0.5).sum(-1)
    assert torch.allclose(K.analytic_kl(p, q), hand, atol=1e-6)


def test_monte_carlo_fallback_without_closed_form():
    mix = D.MixtureSameFamily(D.Categorical(torch.tensor([0.3, 0.7])),
                              D.Normal(torch.tensor([-1.0, 1.0]), torch.tensor([0.5, 0.8])))
    ref = D.Normal(torch.tensor(0.2), torch.tensor(1.3))
    with pytest.raises(NotImplementedError):
        D.kl_divergence(mix, ref)
    grid = torch.linspace(-12, 12, 200_001, dtype=torch.float64)
    lp = mix.log_prob(grid.float()).double()
    lq = ref.log_prob(grid.float()).double()
    exact = torch.trapezoid(lp.exp() * (lp - lq), grid).item()
    est = K.analytic_kl(mix, ref, num_samples_mc=200_000, seed=3).item()
    assert est == pytest.approx(exact, abs=0.01)
    # seeded draws are reproducible and leave the global RNG untouched
    state = torch.get_rng_state()
    again = K.monte_carlo_kl(mix, ref, 200_000, seed=3).item()
    assert again == est and torch.equal(state, torch.get_rng_state())


def test_full_kl_matches_categorical_and_is_chunk_invariant():
    torch.manual_seed(0)
    lp, lq = torch.randn(3, 17, 50), torch.randn(3, 17, 50)
    ref = D.kl_divergence(D.Categorical(logits=lp), D.Categorical(logits=lq))
    for chunk in (1, 5, 16, 51, 4096):
        assert torch.allclose(K.full_kl(lp, lq, chunk_size=chunk), ref, atol=1e-5)


def test_full_kl_gradients_through_checkpointed_chunks():
    torch.manual_seed(1)
    lp = torch.randn(2, 9, 13, requires_grad=True)
    lq = torch.randn(2, 9, 13)
    (g_small,) = torch.autograd.grad(K.full_kl(lp, lq, chunk_size=4).sum(), lp)
    (g_big,) = torch.autograd.grad(K.full_kl(lp, lq, chunk_size=10_000).sum(), lp)
    assert torch.allclose(g_small, g_big, atol=1e-6)


def test_padding_never_changes_a_result():
    torch.manual_seed(2)
    vals = torch.randn(4, 6)
    mask = torch.rand(4, 6) > 0.4
    mask[:, 0] = True
    poisoned = torch.where(mask, vals, torch.tensor(float("nan")))
    for fn in (K.per_sample_mean, K.per_token_mean):
        assert fn(poisoned, mask).item() == pytest.approx(vals[mask].mean().item(), rel=1e-6)
    sums = torch.stack([vals[i][mask[i]].sum() for i in range(4)])
    means = torch.stack([vals[i][mask[i]].mean() for i in range(4)])
    assert torch.allclose(K.per_sequence_sum(poisoned, mask), sums)
    assert torch.allclose(K.per_sequence_mean(poisoned, mask), means)
    assert K.reduce_kl(poisoned, "per_sequence_sum", mask).item() == pytest.approx(
        sums.mean().item(), rel=1e-6)
    # full_kl: garbage logits at padded positions give exactly 0 there and change nothing else
    lp, lq = torch.randn(4, 6, 8), torch.randn(4, 6, 8)
    clean = K.full_kl(lp, lq)
    lp2 = torch.where(mask[..., None], lp, torch.tensor(float("inf")))
    got = K.full_kl(lp2, lq, mask=mask)
    assert torch.equal(got[~mask], torch.zeros(int((~mask).sum())))
    assert torch.allclose(got[mask], clean[mask])


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="shape mismatch"):
        K.sampled_kl(torch.zeros(4), torch.zeros(4, 1))
    with pytest.raises(ValueError, match="estimator"):
        K.sampled_kl(torch.zeros(4), torch.zeros(4), "k9")
    with pytest.raises(ValueError, match="non-finite"):
        K.sampled_kl(torch.tensor([0.0, float("nan")]), torch.zeros(2))
    with pytest.raises(ValueError, match="unit"):
        K.reduce_kl(torch.zeros(3), "per_banana")
    with pytest.raises(ValueError, match="mask"):
        K.per_sequence_sum(torch.zeros(2, 3), torch.ones(3, 2, dtype=torch.bool))


@pytest.mark.parametrize("name", ["k1", "k2", "k3", "abs", "k3_flipped", "tutorial"])
def test_estimator_derivatives_match_autograd_in_torch_and_numpy(name):
    """ESTIMATOR_GRADS (used by the numpy fast path) is d estimator / d log r of ESTIMATORS,
    and both tables give the same numbers on numpy arrays as on torch tensors."""
    import numpy as np

    from klppo.core.kl import ESTIMATOR_GRADS, ESTIMATORS

    log_r = (torch.randn(256, generator=torch.Generator().manual_seed(3)) * 0.7)
    log_r = log_r[log_r != 0].requires_grad_(True)
    (auto,) = torch.autograd.grad(ESTIMATORS[name](log_r).sum(), log_r)
    closed = ESTIMATOR_GRADS[name](log_r.detach())
    assert torch.allclose(closed, auto, rtol=1e-6, atol=1e-7)  # expm1 vs exp - 1: ulps
    x = log_r.detach().numpy()
    np.testing.assert_allclose(ESTIMATORS[name](x), ESTIMATORS[name](log_r.detach()).numpy(),
                               rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(ESTIMATOR_GRADS[name](x), closed.numpy(), rtol=1e-6, atol=1e-7)


def test_peer_estimators_are_what_their_docstrings_say():
    """q = N(0, 1) samples, p = N(0.5, 1): KL(q || p) = 0.125; trlx's flipped k3 has mean
    chi^2 - KL = e^0.25 - 1 - 0.125; the tutorial's e^d d has mean 0.375 e^0.25."""
    import math

    from klppo.core.kl import sampled_kl

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2_000_000, generator=g, dtype=torch.float64)
    logq = -0.5 * x**2
    logp = -0.5 * (x - 0.5) ** 2
    mean = {n: float(sampled_kl(logq, logp, n).mean()) for n in ("k3", "k3_flipped", "tutorial")}
    assert mean["k3"] == pytest.approx(0.125, rel=0.02)
    assert mean["k3_flipped"] == pytest.approx(math.exp(0.25) - 1 - 0.125, rel=0.02)
    assert mean["tutorial"] == pytest.approx(0.375 * math.exp(0.25), rel=0.02)
    assert float(sampled_kl(logq, logp, "tutorial").min()) < 0  # negative on some samples


class _ScoresOwnDraw(D.Normal):
    """A Normal that scores its own draws with a marker offset, to see which path ran."""

    def sample_and_log_prob(self, shape):
        x = self.sample(shape)
        return x, self.log_prob(x) + 100.0

    def rsample_and_log_prob(self, shape):
        x = self.rsample(shape)
        return x, self.log_prob(x) + 200.0


def test_monte_carlo_reparameterize_and_joint_scoring():
    p = D.Normal(torch.zeros(5), torch.ones(5))
    q = D.Normal(torch.full((5,), 0.3), torch.ones(5))
    plain = K.monte_carlo_kl(p, q, 64, seed=0)
    assert torch.equal(K.monte_carlo_kl(p, q, 64, seed=0, reparameterize=True), plain)
    # sample() draws the same Normal values as rsample() here; the estimate only differs if not
    assert torch.equal(K.monte_carlo_kl(p, q, 64, seed=0, reparameterize=False), plain)
    own = _ScoresOwnDraw(torch.zeros(5), torch.ones(5))
    assert torch.allclose(K.monte_carlo_kl(own, q, 64, seed=0), plain + 200.0)
    assert torch.allclose(K.monte_carlo_kl(own, q, 64, seed=0, reparameterize=False),
                          plain + 100.0)
    cat = D.Categorical(logits=torch.zeros(3, 4))
    with pytest.raises(ValueError, match="no rsample"):
        K.monte_carlo_kl(cat, cat, 4, reparameterize=True)
