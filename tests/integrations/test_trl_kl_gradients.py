"""What the gradient of GRPO's in-loss KL term is (the claims of docs/integrations.md, TRL
section), computed exactly: the expectation over x ~ pi of the gradient of TRL's per-token term,
summed over the support of a categorical distribution (no sampling), against the gradients of
both KL directions. Needs torch only.

TRL 1.16's GRPO term per token: ``k3 = exp(lr - lp) - (lr - lp) - 1`` with lp = log pi(x),
lr = log pi_ref(x), times the importance ratio ``pi / pi_old`` (value 1 on the first pass, but
differentiable) when ``use_bias_correction_kl`` (the default).
"""

import torch

from klppo.core.kl import sampled_kl


def _expected_grad(theta, ref_logits, bias_correction):
    """E_{x ~ pi_theta}[grad of TRL's term at x], the expectation taken with pi detached (the
    samples are data), on the first pass (pi_old = pi_theta, detached)."""
    lp_all = torch.log_softmax(theta, -1)
    lr_all = torch.log_softmax(ref_logits, -1)
    probs = lp_all.exp().detach()
    total = 0
    for x in range(len(theta)):
        lp, lr = lp_all[x], lr_all[x]
        term = sampled_kl(lp, lr, "k3")  # exp(lr - lp) - 1 - (lr - lp): TRL's expression
        assert torch.allclose(term, torch.exp(lr - lp) - (lr - lp) - 1)
        if bias_correction:
            term = term * torch.exp(lp - lp.detach())
        total = total + probs[x] * term
    return torch.autograd.grad(total, theta)[0]


def _kl_grads(theta, ref_logits):
    lp = torch.log_softmax(theta, -1)
    lr = torch.log_softmax(ref_logits, -1)
    forward = (lp.exp() * (lp - lr)).sum()   # KL(pi || ref): the KL GRPO logs
    reverse = (lr.exp() * (lr - lp)).sum()   # KL(ref || pi)
    return (torch.autograd.grad(forward, theta, retain_graph=True)[0],
            torch.autograd.grad(reverse, theta)[0])


def test_grpo_k3_gradient_is_kl_pi_ref_with_bias_correction_and_kl_ref_pi_without():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        theta = torch.randn(5, generator=g, dtype=torch.float64).requires_grad_()
        ref = torch.randn(5, generator=g, dtype=torch.float64)
        forward, reverse = _kl_grads(theta, ref)
        with_ratio = _expected_grad(theta, ref, bias_correction=True)
        without = _expected_grad(theta, ref, bias_correction=False)
        assert torch.allclose(with_ratio, forward, atol=1e-12)
        assert torch.allclose(without, reverse, atol=1e-12)
        assert not torch.allclose(forward, reverse, atol=1e-3)  # the two claims differ
