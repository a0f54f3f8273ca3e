"""The KL gradient table: the enumeration against gradients written out by hand (numpy, the
score function of a softmax), random policies, and the library's claims."""

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from klppo.core import kl_gradient_claims as C
from klppo.core.kl_gradients import (
    CORRECTIONS,
    GRADIENT_ESTIMATORS,
    Combination,
    Instance,
    combinations,
    enumerate_table,
    exact_gradients,
    expected_gradient,
    random_instance,
)
from klppo.runs.threads import compute_threads


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: torch's thread pool only slows them down (badly on a busy machine)."""
    with compute_threads(1):
        yield


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def bandit(seed=0, v=4):
    g = np.random.default_rng(seed)
    th, ref, mu = (g.normal(size=(1, v)) for _ in range(3))
    inst = Instance(*(torch.tensor(x) for x in (th, ref, mu)))
    return inst, softmax(th[0]), softmax(ref[0]), softmax(mu[0])


def grad(c, inst):
    return expected_gradient(c, inst).numpy()[0]


def test_one_action_cells_against_hand_derived_gradients():
    inst, pi, ref, mu = bandit()
    eye = np.eye(len(pi))
    score = eye - pi  # score[a] = d log pi(a) / d logits
    d = np.log(pi) - np.log(ref)
    reverse = sum(pi[a] * d[a] * score[a] for a in range(4))  # sum_a pi (log pi - log ref) s
    forward = pi - ref  # d/dlogits of KL(ref || pi) = cross-entropy gradient
    k3 = ref / pi - 1 - np.log(ref / pi)
    w = pi / mu
    rev_t, fwd_t = (g.numpy()[0] for g in exact_gradients(inst))
    np.testing.assert_allclose(rev_t, reverse, atol=1e-14)
    np.testing.assert_allclose(fwd_t, forward, atol=1e-14)

    def cell(est, place, corr):
        return grad(Combination(est, place, "token", corr), inst)

    np.testing.assert_allclose(cell("k1", "reward", "on_policy"), reverse, atol=1e-14)
    np.testing.assert_allclose(cell("k2", "loss", "on_policy"), reverse, atol=1e-14)
    np.testing.assert_allclose(cell("k3", "loss", "on_policy"), forward, atol=1e-14)
    np.testing.assert_allclose(cell("k1", "loss", "on_policy"), 0, atol=1e-15)
    np.testing.assert_allclose(cell("full", "reward", "on_policy"), 0, atol=1e-15)
    np.testing.assert_allclose(cell("full", "loss", "none"), reverse, atol=1e-14)
    # k3 in the reward: E[k3 s] = reverse - forward
    k3_reward = sum(pi[a] * k3[a] * score[a] for a in range(4))
    np.testing.assert_allclose(cell("k3", "reward", "on_policy"), k3_reward, atol=1e-14)
    np.testing.assert_allclose(k3_reward, reverse - forward, atol=1e-14)
    # off-policy: E_mu[w (k3 s + dk3/dlogp s)] with dk3/dlogp = 1 - ref/pi -> the reverse KL
    k3_ratio_grad = sum(mu[a] * w[a] * (k3[a] + 1 - ref[a] / pi[a]) * score[a] for a in range(4))
    np.testing.assert_allclose(cell("k3", "loss", "ratio_grad"), k3_ratio_grad, atol=1e-13)
    np.testing.assert_allclose(k3_ratio_grad, reverse, atol=1e-13)
    # k1 in the reward on mu's samples without the ratio: E_mu[d s], not the KL
    k1_none = sum(mu[a] * d[a] * score[a] for a in range(4))
    np.testing.assert_allclose(cell("k1", "reward", "none"), k1_none, atol=1e-14)
    assert np.abs(k1_none - reverse).max() > 1e-2
    np.testing.assert_allclose(cell("k1", "reward", "ratio"), reverse, atol=1e-14)


def sequence_case(seed=1):
    """Two tokens from a vocabulary of 2: logits rows 0 (root), 1 + y1 (after token y1)."""
    g = np.random.default_rng(seed)
    th, ref = g.normal(size=(3, 2)), g.normal(size=(3, 2))
    inst = Instance(torch.tensor(th), torch.tensor(ref), torch.tensor(g.normal(size=(3, 2))))
    p, q = softmax(th), softmax(ref)
    seqs = []
    for y in itertools.product(range(2), repeat=2):
        rows = [0, 1 + y[0]]
        scores = []
        for t, r in enumerate(rows):  # d log pi(y_t | prefix) / d logits: row r only
            s = np.zeros((3, 2))
            s[r] = np.eye(2)[y[t]] - p[r]
            scores.append(s)
        seqs.append(dict(
            pi=p[0, y[0]] * p[1 + y[0], y[1]], ref=q[0, y[0]] * q[1 + y[0], y[1]],
            d=[np.log(p[r, y[t]] / q[r, y[t]]) for t, r in enumerate(rows)],
            ratio=[q[r, y[t]] / p[r, y[t]] for t, r in enumerate(rows)], scores=scores))
    return inst, seqs


def test_sequence_cells_against_hand_derived_gradients():
    inst, seqs = sequence_case()
    reverse = sum(s["pi"] * sum(s["d"]) * sum(s["scores"]) for s in seqs)
    forward = -sum(s["ref"] * sum(s["scores"]) for s in seqs)
    rev_t, fwd_t = (g.numpy() for g in exact_gradients(inst))
    np.testing.assert_allclose(rev_t, reverse, atol=1e-14)
    np.testing.assert_allclose(fwd_t, forward, atol=1e-14)

    def cell(est, place, gran="token", corr="on_policy"):
        return expected_gradient(Combination(est, place, gran, corr, 2), inst).numpy()

    np.testing.assert_allclose(cell("k1", "reward"), reverse, atol=1e-14)
    # per token in the loss: each token's own score only - a partial gradient of neither KL
    k2_tokens = sum(s["pi"] * sum(dt * st for dt, st in zip(s["d"], s["scores"])) for s in seqs)
    k3_tokens = sum(s["pi"] * sum((1 - r) * st for r, st in zip(s["ratio"], s["scores"]))
                    for s in seqs)
    np.testing.assert_allclose(cell("k2", "loss"), k2_tokens, atol=1e-14)
    np.testing.assert_allclose(cell("k3", "loss"), k3_tokens, atol=1e-14)
    assert np.abs(k2_tokens - reverse).max() > 1e-3 and np.abs(k3_tokens - forward).max() > 1e-3
    # on the sequence log-ratio, k2 and k3 keep their one-action answers
    np.testing.assert_allclose(cell("k2", "loss", "sequence"), reverse, atol=1e-14)
    np.testing.assert_allclose(cell("k3", "loss", "sequence"), forward, atol=1e-14)


def test_every_estimator_placement_and_correction_is_enumerated_and_claimed():
    table = enumerate_table()
    assert C.check_claims(table) == []
    assert {c.combination.estimator for c in table.cells} == set(GRADIENT_ESTIMATORS)
    assert {c.combination.correction for c in table.cells} == set(CORRECTIONS)
    assert len(table.cells) == len(C.CLAIMS) == len(combinations())
    assert table.separation > 1e-3  # the reverse and forward gradients differ on every policy
    # the facts from the literature, read from the table
    assert table.cell("k1", "reward", "on_policy").verdict == "reverse"
    assert table.cell("k3", "loss", "on_policy").verdict == "forward"  # OpenRLHF #1309
    assert table.cell("k2", "loss", "on_policy").verdict == "reverse"
    assert table.cell("k1", "loss", "on_policy").zero
    assert table.cell("analytic", "loss", "on_policy").verdict == "reverse"
    assert table.cell("k3", "loss", "on_policy", "token", 3).verdict == "neither"
    assert table.cell("k3", "loss", "ratio_grad", "token", 3).verdict == "reverse"


def test_claims_hold_for_other_random_policies():
    assert C.check_claims(enumerate_table(instances=2, seed=7)) == []


def test_a_wrong_claim_is_reported(monkeypatch):
    key = (1, "loss", "token", "k3", "on_policy")
    monkeypatch.setitem(C.CLAIMS, key, "reverse")
    [m] = C.check_claims(enumerate_table(instances=1))
    assert (m.combination.estimator, m.claimed, m.enumerated) == ("k3", "reverse", "forward")
    monkeypatch.delitem(C.CLAIMS, key)
    [m] = C.check_claims(enumerate_table(instances=1))
    assert (m.claimed, m.enumerated) == (None, "forward")


UNBIASED = [c for h in (1, 2) for c in combinations((h,)) if C.claimed(c) != "neither"]
logits = st.floats(-2, 2, allow_nan=False, allow_subnormal=False)


@given(st.sampled_from(UNBIASED), st.sampled_from([2, 3, 4]), st.data())
def test_claimed_unbiased_cells_match_on_any_policy(c, vocab, data):
    """Every combination claimed unbiased gives its KL's gradient exactly, on any small policy,
    reference and sampler (pi == pi_ref included), one action or two tokens."""
    rows = sum(vocab**t for t in range(c.horizon))
    draw = lambda: torch.tensor(data.draw(st.lists(logits, min_size=rows * vocab,
                                                   max_size=rows * vocab)),
                                dtype=torch.float64).reshape(rows, vocab)
    inst = Instance(draw(), draw(), draw())
    rev, fwd = exact_gradients(inst)
    want = rev if C.claimed(c) == "reverse" else fwd
    torch.testing.assert_close(expected_gradient(c, inst), want, atol=1e-10, rtol=0)


def test_instances_are_deterministic_and_bad_cells_refused():
    gen = lambda: torch.Generator().manual_seed(3)
    a, b = random_instance(3, 2, gen()), random_instance(3, 2, gen())
    assert torch.equal(a.theta, b.theta) and a.horizon == 3
    with pytest.raises(ValueError, match="does not apply"):
        expected_gradient(Combination("full", "loss", "sequence", "on_policy", 3), a)
    with pytest.raises(ValueError, match="horizon"):
        expected_gradient(Combination("k1", "loss", "token", "on_policy", 1), a)


def test_gradient_warning_names_the_combination_and_its_kl():
    assert C.gradient_warning(Combination("k1", "reward", "token", "on_policy", 5)) is None
    msg = C.gradient_warning(Combination("k3", "loss", "token", "on_policy", 1))
    assert "k3 in the loss" in msg and "KL(reference || policy), the forward KL" in msg
    msg = C.gradient_warning(Combination("k3", "loss", "token", "on_policy", 24))
    assert "neither" in msg and "for a single token: KL(reference || policy)" in msg
    assert [c.describe() for c in C.unbiased("forward", 1)] == [
        "k3 in the loss (per token, on-policy, 1 token)",
        "k3 in the loss (per token, off-policy, detached ratio, 1 token)"]


def test_trust_region_kl_on_its_own_samples_has_the_right_gradient():
    """docs/algorithms.md: the Gymnasium trainer's KL(pi_old || pi_new) on samples from pi_old
    (its fixed first argument), differentiated in the loss: k1 and k3 give its gradient, k2
    does not."""
    from klppo.core.kl import sampled_kl

    g = torch.Generator().manual_seed(0)
    old, new = (torch.randn(5, generator=g, dtype=torch.float64) for _ in range(2))
    logp_old = torch.log_softmax(old, 0)
    p_old = logp_old.exp()

    def expected(est):
        x = new.clone().requires_grad_(True)
        k = sampled_kl(logp_old, torch.log_softmax(x, 0), est)
        return torch.autograd.grad((p_old * k).sum(), x)[0]

    exact = torch.softmax(new, 0) - p_old  # d/dlogits of KL(old || new), by hand
    torch.testing.assert_close(expected("k1"), exact, atol=1e-14, rtol=0)
    torch.testing.assert_close(expected("k3"), exact, atol=1e-14, rtol=0)
    assert (expected("k2") - exact).abs().max() > 1e-2
