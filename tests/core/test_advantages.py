import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from klppo.core.advantages import gae, normalize_advantage


def slow_gae(rewards, values, next_values, terminated, truncated, gamma, lam):
    """Reference: A_t = sum_k (gamma lam)^k delta_{t+k} until the first episode end."""
    T, N = rewards.shape
    adv = torch.zeros(T, N, dtype=torch.float64)
    for n in range(N):
        for t in range(T):
            total, coef = 0.0, 1.0
            for k in range(t, T):
                nv = 0.0 if terminated[k, n] else float(next_values[k, n])
                total += coef * (float(rewards[k, n]) + gamma * nv - float(values[k, n]))
                if terminated[k, n] or truncated[k, n]:
                    break
                coef *= gamma * lam
            adv[t, n] = total
    return adv


def rollout(T, N, gen, p_term=0.1, p_trunc=0.05):
    r = torch.randn(T, N, generator=gen, dtype=torch.float64)
    v = torch.randn(T + 1, N, generator=gen, dtype=torch.float64)
    term = torch.rand(T, N, generator=gen) < p_term
    trunc = (torch.rand(T, N, generator=gen) < p_trunc) & ~term
    final_v = torch.randn(T, N, generator=gen, dtype=torch.float64)
    next_v = torch.where(trunc, final_v, v[1:])
    return r, v[:-1], next_v, term, trunc


def test_hand_computed_small_case():
    r = torch.tensor([[1.0], [2.0], [3.0]], dtype=torch.float64)
    v = torch.tensor([[0.5], [1.0], [1.5]], dtype=torch.float64)
    nv = torch.tensor([[1.0], [1.5], [2.0]], dtype=torch.float64)
    z = torch.zeros(3, 1, dtype=torch.bool)
    g, lam = 0.9, 0.8
    d2 = 3 + g * 2.0 - 1.5
    d1 = 2 + g * 1.5 - 1.0
    d0 = 1 + g * 1.0 - 0.5
    a2 = d2
    a1 = d1 + g * lam * a2
    a0 = d0 + g * lam * a1
    adv, ret = gae(r, v, nv, z, z, g, lam)
    assert adv[:, 0].tolist() == pytest.approx([a0, a1, a2], abs=1e-12)
    assert torch.allclose(ret, adv + v)


@given(st.integers(1, 12), st.integers(1, 4), st.floats(0, 1), st.floats(0, 1), st.integers(0, 999))
def test_matches_slow_reference(T, N, gamma, lam, seed):
    gen = torch.Generator().manual_seed(seed)
    r, v, nv, term, trunc = rollout(T, N, gen, 0.2, 0.1)
    adv, _ = gae(r, v, nv, term, trunc, gamma, lam)
    # float64, |adv| < ~250 (<= 12 deltas of randn terms): the two summation orders differ by
    # < 1e-12; atol is the floor where adv is near 0 and rtol * |adv| alone would be ~0.
    assert torch.allclose(adv, slow_gae(r, v, nv, term, trunc, gamma, lam), atol=1e-10)


def test_gamma_lambda_one_gives_monte_carlo_returns():
    gen = torch.Generator().manual_seed(0)
    T = 10
    r = torch.randn(T, 1, generator=gen, dtype=torch.float64)
    v = torch.randn(T, 1, generator=gen, dtype=torch.float64)
    term = torch.zeros(T, 1, dtype=torch.bool)
    term[4] = term[9] = True
    nv = torch.cat([v[1:], torch.zeros(1, 1, dtype=torch.float64)])
    _, ret = gae(r, v, nv, term, torch.zeros_like(term), 1.0, 1.0)
    mc = torch.cat([r[:5].flip(0).cumsum(0).flip(0), r[5:].flip(0).cumsum(0).flip(0)])
    assert torch.allclose(ret, mc, atol=1e-12)


def test_splitting_at_a_terminal_gives_the_same_result():
    gen = torch.Generator().manual_seed(1)
    r, v, nv, term, trunc = rollout(20, 3, gen, 0.0, 0.0)
    term[7] = True
    whole, _ = gae(r, v, nv, term, trunc, 0.99, 0.95)
    first, _ = gae(r[:8], v[:8], nv[:8], term[:8], trunc[:8], 0.99, 0.95)
    second, _ = gae(r[8:], v[8:], nv[8:], term[8:], trunc[8:], 0.99, 0.95)
    assert torch.allclose(whole[:8], first, atol=1e-12) and torch.allclose(whole[8:], second)


def test_truncation_bootstraps_and_termination_does_not():
    r = torch.tensor([[1.0, 1.0]], dtype=torch.float64)
    v = torch.tensor([[2.0, 2.0]], dtype=torch.float64)
    nv = torch.tensor([[10.0, 10.0]], dtype=torch.float64)
    term = torch.tensor([[True, False]])
    trunc = torch.tensor([[False, True]])
    adv, _ = gae(r, v, nv, term, trunc, 0.5, 0.9)
    assert adv.tolist() == [[1.0 - 2.0, 1.0 + 0.5 * 10.0 - 2.0]]


def test_constant_critic_analytic_case():
    # V = c everywhere, reward 1 each step, no episode end, lambda = 1: A_t = sum gamma^k
    # - c + gamma^(T-t) c
    T, g, c = 6, 0.9, 3.0
    r = torch.ones(T, 1, dtype=torch.float64)
    v = torch.full((T, 1), c, dtype=torch.float64)
    z = torch.zeros(T, 1, dtype=torch.bool)
    adv, _ = gae(r, v, v.clone(), z, z, g, 1.0)
    for t in range(T):
        expect = sum(g**k for k in range(T - t)) + g ** (T - t) * c - c
        assert adv[t, 0].item() == pytest.approx(expect, abs=1e-12)


def test_bad_inputs():
    x = torch.zeros(4, 2)
    b = torch.zeros(4, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="shape mismatch"):
        gae(x, x, torch.zeros(4, 1), b, b)
    with pytest.raises(ValueError, match="gamma"):
        gae(x, x, x, b, b, gamma=1.5)
    with pytest.raises(ValueError, match=r"\[T, N\]"):
        gae(torch.zeros(4), torch.zeros(4), torch.zeros(4), b[:, 0], b[:, 0])


def test_normalize_advantage():
    a = torch.tensor([1.0, 2.0, 3.0, 6.0])
    n = normalize_advantage(a)
    assert n.mean().abs() < 1e-7 and n.std().item() == pytest.approx(1.0, abs=1e-6)
    assert normalize_advantage(torch.tensor([5.0])).tolist() == [0.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_numpy_loop_equals_the_torch_loop_bit_for_bit(dtype):
    """Plain CPU tensors take a numpy loop; tensors that need a gradient take the torch loop.
    Both do the same float operations, so the results agree exactly, and gradients flow."""
    gen = torch.Generator().manual_seed(7)
    r, v, nv, term, trunc = (x.to(dtype) if x.is_floating_point() else x
                             for x in rollout(256, 64, gen))
    fast_adv, fast_ret = gae(r, v, nv, term, trunc, 0.99, 0.95)
    vg = v.clone().requires_grad_(True)
    adv, ret = gae(r, vg, nv, term, trunc, 0.99, 0.95)
    assert torch.equal(fast_adv, adv.detach()) and torch.equal(fast_ret, ret.detach())
    adv.sum().backward()
    assert vg.grad is not None and bool((vg.grad != 0).any())


@pytest.mark.parametrize("grad", [False, True])
def test_rollouts_side_by_side_equal_each_alone_bit_for_bit(grad):
    """``[R, T, N]``: R rollouts in one call (the engine's stacked buffer) give each rollout
    the numbers it gets alone, on the numpy loop and on the torch loop."""
    gen = torch.Generator().manual_seed(3)
    rows = [rollout(64, 4, gen) for _ in range(5)]
    r, v, nv, term, trunc = (torch.stack(x).float() if x[0].is_floating_point()
                             else torch.stack(x) for x in zip(*rows))  # the engine's float32
    # a rollout with large and tiny values, where a fused or reordered operation would round
    r[2] = r[2] * 1e6
    v[3] = v[3] * 1e-30
    if grad:
        v.requires_grad_(True)
    adv, ret = gae(r, v, nv, term, trunc, 0.99, 0.95)
    for a in range(5):
        alone = gae(r[a], v[a], nv[a], term[a], trunc[a], 0.99, 0.95)
        assert torch.equal(adv[a], alone[0]) and torch.equal(ret[a], alone[1])
    deeper, _ = gae(*(x.reshape(5, 1, *x.shape[1:]) for x in (r, v, nv, term, trunc)),
                    0.99, 0.95)
    assert torch.equal(deeper[:, 0], adv)


def _rollouts(stacked: bool, R: int = 3):
    """R ``[8, 2]`` rollouts with random rewards and values: R buffers, or the rows of one
    stacked buffer (the lock-step collection's layout)."""
    import numpy as np

    from klppo.rl.rollout import BUFFER_FIELDS, RolloutBuffer

    gen = torch.Generator().manual_seed(1)
    if stacked:
        one = RolloutBuffer.allocate(8, 2, 3, (), np.int64, 2)
        arrays = {k: torch.zeros((R, *getattr(one, k).shape), dtype=getattr(one, k).dtype)
                  for k in BUFFER_FIELDS}
        parent = RolloutBuffer(**arrays)
        bufs = [RolloutBuffer(**{k: v[r] for k, v in arrays.items()}, stacked=(parent, r))
                for r in range(R)]
    else:
        bufs = [RolloutBuffer.allocate(8, 2, 3, (), np.int64, 2) for _ in range(R)]
    for b in bufs:
        for f in ("rewards", "values", "next_values"):
            getattr(b, f).copy_(torch.randn(8, 2, generator=gen))
        b.terminated.copy_(torch.rand(8, 2, generator=gen) < 0.2)
        b.truncated.copy_(torch.rand(8, 2, generator=gen) < 0.1)
    return bufs


def _alone(b):
    from klppo.rl.config import PPOConfig

    return gae(b.rewards, b.values, b.next_values, b.terminated, b.truncated,
               PPOConfig().gamma, PPOConfig().gae_lambda)


@pytest.mark.parametrize("stacked", [False, True])
def test_a_group_writes_each_rollout_its_own_advantages(stacked):
    """``group_gae`` writes into every buffer the advantages and returns it gets alone: a
    group of separate buffers (stacked for the call), and the rows of one stacked buffer
    (computed on it in place; the order of the rows in the group does not matter)."""
    from klppo.rl.config import PPOConfig
    from klppo.rl.engine.advantages import group_gae, whole

    bufs = _rollouts(stacked)
    order = [bufs[2], bufs[0], bufs[1]]
    assert (whole(order) is not None) == stacked
    assert whole(order[:2]) is None  # two rows of three: stacked for the call
    assert group_gae([(PPOConfig(), b) for b in order]) == [None] * 3
    for b in bufs:
        adv, ret = _alone(b)
        assert torch.equal(b.advantages, adv) and torch.equal(b.returns, ret)


@pytest.mark.parametrize("stacked", [False, True])
def test_a_bad_rollout_of_a_group_fails_alone(stacked):
    """``group_gae``: a non-finite value in one run's rollout is that run's error, with its
    own index; the other rollouts of its group get the advantages they get alone."""
    from klppo.rl.config import PPOConfig
    from klppo.rl.engine.advantages import group_gae

    bufs = _rollouts(stacked)
    bufs[1].values[5, 1] = float("nan")
    out = group_gae([(PPOConfig(), b) for b in bufs])
    assert isinstance(out[1], ValueError) and "[5, 1]" in str(out[1])
    for k in (0, 2):
        assert out[k] is None
        adv, ret = _alone(bufs[k])
        assert torch.equal(bufs[k].advantages, adv) and torch.equal(bufs[k].returns, ret)
