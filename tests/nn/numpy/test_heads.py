"""Head-level parity: every quantity of the numpy heads against klppo.nn.distributions (torch).

For each head (categorical of several widths, diagonal Gaussian of several dims) on random
inputs: log-prob, entropy, KL(old || new), its per-iteration mean, the runner's sampled log-prob,
and the backward (d (g_logp . logp + g_ent . H + g_kl . KL) / d outputs, and d / d log-std)
against torch autograd through the torch head.
"""

import numpy as np
import pytest
import torch

from klppo.nn.distributions import CategoricalHead, DiagGaussianHead
from klppo.nn.numpy.heads import Categorical, Gaussian

SEEDS = [0, 1, 2]
TOL = dict(rtol=2e-5, atol=2e-6)


def _close(numpy_value, torch_value, name):
    np.testing.assert_allclose(np.asarray(numpy_value, np.float64),
                               torch_value.detach().double().numpy(), err_msg=name, **TOL)


def _weights(rng, n):
    return [rng.standard_normal(n).astype(np.float32) for _ in range(3)]


def _torch_loss(head, params, actions, old, g):
    logp = head.log_prob(params, actions)
    ent, kl = head.entropy(params), head.kl(old, params)
    g_logp, g_ent, g_kl = (torch.from_numpy(x) for x in g)
    return logp, ent, kl, (g_logp * logp).sum() + (g_ent * ent).sum() + (g_kl * kl).sum()


@pytest.mark.parametrize("k", [2, 3, 6, 9])
@pytest.mark.parametrize("seed", SEEDS)
def test_categorical_head_matches_torch(k, seed):
    rng = np.random.default_rng(seed)
    n = 257
    out = (rng.standard_normal((n, k)) * 2).astype(np.float32)
    old = (out + rng.standard_normal((n, k)) * 0.5).astype(np.float32)
    actions = rng.integers(0, k, n)
    g = _weights(rng, n)
    head = CategoricalHead(k)
    logits = torch.from_numpy(out).requires_grad_(True)
    t_logp, t_ent, t_kl, t_loss = _torch_loss(head, logits, torch.from_numpy(actions),
                                              torch.from_numpy(old), g)
    (t_grad,) = torch.autograd.grad(t_loss, logits)

    logp, ent, kl, backward = Categorical().step(out, actions, old)
    _close(logp, t_logp, "logp")
    _close(ent, t_ent, "entropy")
    _close(kl, t_kl, "kl")
    _close(backward(*g), t_grad, "d / d logits")
    _close(Categorical().kl_mean(out, old), t_kl.mean(), "kl_mean")
    # the backward without the optional terms is the log-prob's alone
    (t_grad_logp,) = torch.autograd.grad((torch.from_numpy(g[0]) * head.log_prob(
        logits, torch.from_numpy(actions))).sum(), logits)
    _close(Categorical().step(out, actions, old)[3](g[0], None, None), t_grad_logp, "d logp")


@pytest.mark.parametrize("k", [2, 5])
def test_categorical_runner_logp_is_the_heads(k):
    rng = np.random.default_rng(k)
    out = rng.standard_normal((512, k)).astype(np.float32)
    action, logp, params = Categorical().act(out, np.random.default_rng(0))
    _close(logp, CategoricalHead(k).log_prob(torch.from_numpy(params), torch.from_numpy(action)),
           "runner logp")


@pytest.mark.parametrize("d", [1, 2, 6])
@pytest.mark.parametrize("seed", SEEDS)
def test_gaussian_head_matches_torch(d, seed):
    rng = np.random.default_rng(seed)
    n = 257
    mean = rng.standard_normal((n, d)).astype(np.float32)
    log_std = (rng.standard_normal(d) * 0.5).astype(np.float32)
    old = np.concatenate([mean + 0.3 * rng.standard_normal((n, d)),
                          log_std + 0.2 * rng.standard_normal((n, d))], 1).astype(np.float32)
    actions = (mean + np.exp(log_std) * rng.standard_normal((n, d))).astype(np.float32)
    g = _weights(rng, n)
    head = DiagGaussianHead(d)
    t_mean = torch.from_numpy(mean).requires_grad_(True)
    t_ls = torch.from_numpy(log_std.copy()).requires_grad_(True)
    params = torch.cat([t_mean, t_ls.expand(n, d)], 1)
    t_logp, t_ent, t_kl, t_loss = _torch_loss(head, params, torch.from_numpy(actions),
                                              torch.from_numpy(old), g)
    t_g_mean, t_g_ls = torch.autograd.grad(t_loss, (t_mean, t_ls))

    g_log_std = np.zeros(d, np.float32)
    np_head = Gaussian(log_std, g_log_std)
    logp, ent, kl, backward = np_head.step(mean, actions, old)
    _close(logp, t_logp, "logp")
    _close(ent, t_ent, "entropy")
    _close(kl, t_kl, "kl")
    _close(backward(*g), t_g_mean, "d / d mean")
    _close(g_log_std, t_g_ls, "d / d log_std")
    _close(np_head.kl_mean(mean, old), t_kl.mean(), "kl_mean")


@pytest.mark.parametrize("d", [1, 3])
def test_gaussian_runner_logp_is_the_heads(d):
    rng = np.random.default_rng(d)
    mean = rng.standard_normal((512, d)).astype(np.float32)
    log_std = np.full(d, -0.4, np.float32)
    action, logp, params = Gaussian(log_std).act(mean, np.random.default_rng(0))
    np.testing.assert_array_equal(params[:, d:], np.broadcast_to(log_std, (512, d)))
    _close(logp, DiagGaussianHead(d).log_prob(torch.from_numpy(params),
                                              torch.from_numpy(action)), "runner logp")
