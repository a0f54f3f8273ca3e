"""The loss-side KL forms against exact enumeration: every sequence of a small autoregressive
policy, weighted by the sampler's probability, the per-sequence term differentiated by autograd,
compared with the gradient of KL(pi || pi_ref) over whole sequences."""

import pytest
import torch

from klppo.core.kl_gradient_claims import claimed
from klppo.core.kl_gradients import Combination, _token_logp, exact_gradients, random_instance
from klppo.core.kl_loss import KL_LOSS_FORMS, kl_loss_combination, kl_loss_terms


def _expected_gradient(form: str, inst, on_policy: bool) -> torch.Tensor:
    theta = inst.theta.detach().clone().requires_grad_(True)
    t = inst.horizon
    lp = _token_logp(theta, t)
    lr, lm = _token_logp(inst.ref, t), _token_logp(inst.mu, t)
    old = lp.detach() if on_policy else lm
    weight = old.sum(1).exp()  # the probability of each sequence under the sampler
    terms = kl_loss_terms(form, lp, lr, old, baseline=False)  # every sequence, weighted
    (g,) = torch.autograd.grad((weight * terms).sum(), theta)
    return g


@pytest.mark.parametrize("on_policy", [True, False])
@pytest.mark.parametrize("form", KL_LOSS_FORMS)
def test_each_form_descends_the_kl_its_cell_claims(form, on_policy):
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        inst = random_instance(3, 2, gen)
        reverse, forward = exact_gradients(inst)
        g = _expected_gradient(form, inst, on_policy)
        est, place, gran, corr = kl_loss_combination(form, first_pass=on_policy)
        verdict = claimed(Combination(est, place, gran, corr, 3))
        gap = float((g - reverse).abs().max())
        if verdict == "reverse":
            assert gap < 1e-10
        else:
            assert verdict == "neither" and gap > 1e-3
    # k1_to_go: exact on fresh samples; on a sampler's, the per-token ratio is PPO's approximation
    assert (form != "k3" and (on_policy or form != "k1_to_go")) == (verdict == "reverse")


def test_the_terms_are_per_sequence_over_the_valid_tokens():
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.2, -9.0]])
    ref = torch.tensor([[-1.5, -1.0, -0.5], [-0.1, -0.4, 3.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    d = torch.tensor([0.5 - 1.0 + 0.0, -0.2 + 0.2])  # per-sequence log-ratio, padding left out
    k2 = kl_loss_terms("k2_sequence", logp, ref, logp, mask)  # on-policy: w = 1
    assert torch.allclose(k2, 0.5 * d * d)
    r = ref - logp
    k3 = ((torch.exp(r) - 1 - r) * mask).sum(1)
    assert torch.allclose(kl_loss_terms("k3", logp, ref, logp, mask), k3)
    assert torch.allclose(kl_loss_terms("k3_ratio", logp, ref, logp - 0.1, mask),
                          torch.exp(torch.tensor([0.3, 0.2])) * k3)
    with pytest.raises(ValueError, match="kl_loss must be one of k1_to_go, k2_sequence, k3_"):
        kl_loss_terms("k1", logp, ref, logp, mask)


def test_k1_to_go_by_hand_value_and_gradient():
    # value: D = sum_t d_t over the valid tokens; gradient in log pi_t: w_t * G_t, with
    # w_t = pi_t / pi_old_t and G_t = sum_{s >= t} d_s (padding neither counted nor credited)
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.2, -9.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, -0.5], [-0.1, -0.4, 3.0]])
    old = torch.tensor([[-1.2, -2.0, -0.1], [-0.3, -0.5, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    terms = kl_loss_terms("k1_to_go", logp, ref, old, mask, baseline=False)
    assert torch.allclose(terms, torch.tensor([0.5 - 1.0 + 0.0, -0.2 + 0.2]), atol=1e-6)
    (g,) = torch.autograd.grad(terms.sum(), logp)
    import math
    d = [[0.5, -1.0, 0.0], [-0.2, 0.2, 0.0]]
    w = [[math.exp(0.2), 1.0, math.exp(-0.4)], [1.0, math.exp(0.3), 0.0]]
    want = [[w[i][t] * sum(d[i][t:]) for t in range(3)] for i in range(2)]
    assert torch.allclose(g, torch.tensor(want), atol=1e-6)


def test_k1_to_go_leave_one_out_baseline_by_hand():
    # b_t: the other responses' mean G_t where they have a token (none: 0); the value is D still
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.2, -9.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, -0.5], [-0.1, -0.4, 3.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    terms = kl_loss_terms("k1_to_go", logp, ref, logp.detach(), mask)  # on-policy: w_t = 1
    assert torch.allclose(terms, torch.tensor([-0.5, 0.0]), atol=1e-6)
    (g,) = torch.autograd.grad(terms.sum(), logp)
    go = [[-0.5, -1.0, 0.0], [0.0, 0.2, 0.0]]  # G_t of each response (padding: 0)
    want = [[go[0][0] - go[1][0], go[0][1] - go[1][1], go[0][2] - 0.0],
            [go[1][0] - go[0][0], go[1][1] - go[0][1], 0.0]]
    assert torch.allclose(g, torch.tensor(want), atol=1e-6)


@pytest.mark.parametrize("on_policy", [True, False])
def test_k1_to_go_baseline_keeps_the_expected_gradient(on_policy):
    # every pair of independent draws (y1, y2) ~ q x q, weighted: the batch mean of the
    # baselined terms has the expected gradient of the plain form (exactly the reverse KL's
    # on-policy); the baseline changes the variance only
    inst = random_instance(3, 2, torch.Generator().manual_seed(5))
    theta = inst.theta.detach().clone().requires_grad_(True)
    lp = _token_logp(theta, 3)
    lr, lm = _token_logp(inst.ref, 3), _token_logp(inst.mu, 3)
    old = lp.detach() if on_policy else lm
    q = old.sum(1).exp()
    n = len(q)
    i, j = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    i, j = i.reshape(-1), j.reshape(-1)
    total = torch.zeros(())
    for a, b in zip(i.tolist(), j.tolist()):
        pair = [a, b]
        t = kl_loss_terms("k1_to_go", lp[pair], lr[pair], old[pair])
        total = total + q[a] * q[b] * t.mean()
    (g_pairs,) = torch.autograd.grad(total, theta, retain_graph=True)
    plain = (q * kl_loss_terms("k1_to_go", lp, lr, old, baseline=False)).sum()
    (g_plain,) = torch.autograd.grad(plain, theta)
    assert torch.allclose(g_pairs, g_plain, atol=1e-10)
    if on_policy:
        reverse, _ = exact_gradients(inst)
        assert torch.allclose(g_pairs, reverse, atol=1e-10)
