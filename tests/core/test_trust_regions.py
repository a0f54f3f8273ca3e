"""The trust-region catalogue: every objective's gradient equals autograd of its paper's formula,
transcribed here from the paper (not from klppo's code), and equals ``w A + beta_t`` (the
template form with klppo's detached beta_t), on random batches that include the band edges.

Token-level batches set some ratios to exactly ``1 - eps``, ``1``, ``1 + eps`` (and the high edge
of an asymmetric band): the ratio is built as ``w0 * exp(x - sg(x))`` from the log-probability
leaf ``x``, so its value is exactly ``w0`` and its derivative in ``x`` is ``w0``, as for
``exp(x - logp_old)``.
"""

import math

import numpy as np
import pytest
import torch

from klppo.core.loss import PPOLoss
from klppo.core.objectives import OBJECTIVES, Band, Knobs, ShapeSpec, make_objective

F32 = torch.float32


def token_batch(n=256, seed=0, eps_low=0.2, eps_high=0.2, spread=0.35, probs=False):
    """``(w0, logp_old, adv)``: ratios with exact band edges, log-probabilities <= 0."""
    g = torch.Generator().manual_seed(seed)
    logp_old = -torch.rand(n, generator=g) * 3 - 0.05
    w0 = torch.exp(spread * torch.randn(n, generator=g))
    edges = torch.tensor([1 - eps_low, 1.0, 1 + eps_high], dtype=F32)
    w0[: 3 * 8] = edges.repeat(8)
    adv = 2 * torch.randn(n, generator=g)
    adv[: 3 * 8: 2] *= -1  # both signs at every edge
    adv[-4:] = 0.0
    if probs:  # keep exp(logp_new) <= 1
        logp_old = torch.minimum(logp_old, -torch.log(w0) - 1e-3)
    return w0, logp_old, adv


def leaf(w0, logp_old):
    """The log-probability leaf ``x`` (value ``logp_old + log w0``) and the ratio built from it."""
    x = (logp_old + torch.log(w0)).clone().requires_grad_(True)
    return x, w0 * torch.exp(x - x.detach())


def grad(fn, w0, logp_old):
    x, ratio = leaf(w0, logp_old)
    (g,) = torch.autograd.grad(fn(x, ratio).sum(), x)
    return g


def check(obj, reference, w0, logp_old, adv, atol=1e-6, value_offset=0.0, beta=0.0):
    """klppo's autograd == the paper's autograd == w A + beta_t == the numpy closed form (whose
    value is the paper's, less ``value_offset``: a term without gradient), at the controller's
    ``beta`` where the objective reads one."""
    def ours(x, ratio):
        return obj.term(ratio, x, logp_old, adv, None, beta).objective

    g_ours, g_paper = grad(ours, w0, logp_old), grad(reference, w0, logp_old)
    assert torch.allclose(g_ours, g_paper, rtol=1e-5, atol=atol), (g_ours - g_paper).abs().max()
    x, ratio = leaf(w0, logp_old)
    bt = obj.term(ratio, x, logp_old, adv, None, beta).beta_t
    template = w0 * adv + bt
    assert torch.allclose(template, g_paper, rtol=1e-5, atol=atol)
    if obj.has_closed_form:
        lw = (x.detach() - logp_old).numpy()
        form = obj.closed_form(w0.numpy(), adv.numpy(), (w0 * adv).numpy(), x.detach().numpy(),
                               lw, None, beta, logp_old=logp_old.numpy())
        assert np.allclose(form.d_logp, g_paper.numpy(), rtol=1e-5, atol=atol)
        value = reference(x.detach(), ratio.detach()) - value_offset
        assert np.allclose(form.value, value.numpy(), rtol=1e-5, atol=atol)
    return g_paper


def clip(r, lo, hi):
    return torch.clamp(r, 1 - lo, 1 + hi)


# ------------------------------------------------------------------------------- token level
def test_dapo_clip_higher_is_clip_with_an_asymmetric_band():
    """DAPO Eq. 10: (1 / sum_i |o_i|) sum_i sum_t min(r A, clip(r, 1 - 0.2, 1 + 0.28) A): the
    clip objective with eps_low 0.2, eps_high 0.28, and PPOLoss's token mean is DAPO's
    token-level sum over all tokens of the batch (responses of unequal lengths)."""
    w0, lo, adv = token_batch(eps_high=0.28)
    lengths = [30, 70, 100, 56]
    obj = make_objective("clip", Band(0.2, 0.2, 0.28))
    check(obj, lambda x, r: torch.min(r * adv, clip(r, 0.2, 0.28) * adv), w0, lo, adv)

    loss = PPOLoss("clip", eps_low=0.2, eps_high=0.28, normalize_advantage="none")
    x, ratio = leaf(w0, lo)
    (g_loss,) = torch.autograd.grad(loss(x, lo, adv)["loss_objective"], x)
    x2 = x.detach().clone().requires_grad_(True)
    r2 = torch.exp(x2 - lo)
    per_seq = [s.sum() for s in torch.split(torch.min(r2 * adv, clip(r2, 0.2, 0.28) * adv),
                                            lengths)]
    (g_dapo,) = torch.autograd.grad(-sum(per_seq) / sum(lengths), x2)
    assert torch.allclose(g_loss, g_dapo, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("eps_low, eps_high", [(0.2, 0.2), (10.0, 0.28)])
def test_cispo(eps_low, eps_high):
    """MiniMax-M1: J = sg(clip(r, 1 - eps_low, 1 + eps_high)) A log pi (no lower bound in the
    paper: eps_low >= 1)."""
    w0, lo, adv = token_batch(eps_low=min(eps_low, 0.5), eps_high=eps_high)
    obj = make_objective("cispo", Band(0.2, eps_low, eps_high))
    check(obj, lambda x, r: clip(r, eps_low, eps_high).detach() * adv * x, w0, lo, adv)


@pytest.mark.parametrize("tau_pos, tau_neg", [(1.0, 1.05), (3.0, 0.5)])
def test_sapo(tau_pos, tau_neg):
    """Qwen SAPO: J = f(r) A, f(r) = sigmoid(tau (r - 1)) 4 / tau, tau_pos for A > 0, tau_neg
    for A < 0; at r = 1 the gradient is the unclipped one (f'(1) = 1)."""
    w0, lo, adv = token_batch()
    obj = make_objective("sapo", knobs=Knobs(tau_pos=tau_pos, tau_neg=tau_neg))

    def paper(x, r):
        tau = torch.where(adv > 0, torch.tensor(tau_pos), torch.tensor(tau_neg))
        return torch.sigmoid(tau * (r - 1)) * 4 / tau * adv

    g = check(obj, paper, w0, lo, adv)
    at_one = w0 == 1
    assert torch.allclose(g[at_one], adv[at_one], atol=1e-6)


def test_sapo_default_temperatures_are_the_papers():
    obj = make_objective("sapo")
    assert (obj.knob("tau_pos"), obj.knob("tau_neg")) == (1.0, 1.05)


@pytest.mark.parametrize("eps", [0.2, 0.1])
def test_spo(eps):
    """Simple Policy Optimization: J = r A - |A| / (2 eps) (r - 1)^2; its gradient is also the
    per_sample_kl template with the spo shape."""
    w0, lo, adv = token_batch(eps_low=eps, eps_high=eps)
    obj = make_objective("spo", Band(eps))
    g = check(obj, lambda x, r: r * adv - adv.abs() / (2 * eps) * (r - 1) ** 2, w0, lo, adv)
    shaped = make_objective("per_sample_kl", Band(eps), ShapeSpec("spo"))
    x, ratio = leaf(w0, lo)
    bt = shaped.term(ratio, x, lo, adv, None, 0.0).beta_t
    assert torch.allclose(w0 * adv + bt, g, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tau", [1.0, 0.1])
def test_squared_log_ratio_is_kimis_gradient(tau):
    """Kimi k1.5 Sec. 2.3.2: grad = (r - mean r) grad log pi - tau/2 grad (log pi/pi_old)^2,
    per token with the advantage in place of r - mean r."""
    w0, lo, adv = token_batch()
    obj = make_objective("sq_log_ratio", knobs=Knobs(tau=tau))
    # klppo's value is A log w: the paper's A log pi less A log pi_old (no gradient)
    check(obj, lambda x, r: adv * x - tau / 2 * (x - lo) ** 2, w0, lo, adv, value_offset=adv * lo)


@pytest.mark.parametrize("lam, delta", [(0.5, 0.02), (3.0, 0.1), (0.0, 0.05)])
def test_r2vpo_is_the_lagrangian_of_the_ratio_variance_constraint(lam, delta):
    """R2VPO (arXiv:2601.03320, abstract): maximise E[w A] subject to Var(w) <= delta, with
    Var(w) = E[(w - E w)^2] and E w = 1 under the rollout policy; its Lagrangian per sample is
    w A - lambda ((w - 1)^2 - delta). klppo's value drops the constant lambda delta."""
    w0, lo, adv = token_batch()
    obj = make_objective("r2vpo")
    check(obj, lambda x, r: r * adv - lam * ((r - 1) ** 2 - delta), w0, lo, adv, beta=lam,
          value_offset=lam * delta)
    x, ratio = leaf(w0, lo)
    term = obj.term(ratio, x, lo, adv, None, lam)
    assert torch.equal(term.kl, (w0 - 1) ** 2)  # the constraint's divergence, per sample
    assert bool((term.beta_t[w0 == 1] == 0).all())  # no brake at w = 1


def test_r2vpo_at_the_multipliers_floor_is_finite_for_any_ratio():
    """lambda = 0 (where the projected dual step often sits): no penalty, so a ratio whose
    (w - 1)^2 overflows float32 gives no 0 * inf; the closed form agrees."""
    obj = make_objective("r2vpo")
    lo = torch.tensor([-50.0, -90.0, -1.0])
    x = torch.tensor([-5.0, -10.0, -1.0], requires_grad=True)  # log w = 45, 80, 0: w finite
    adv = torch.tensor([1e-20, -1e-30, 1.0])
    term = obj.term(torch.exp(x - lo), x, lo, adv, None, 0.0)
    assert bool(torch.isfinite(term.objective).all()) and bool((term.beta_t == 0).all())
    w = torch.exp(x - lo).detach().numpy()
    form = obj.closed_form(w, adv.numpy(), w * adv.numpy(), x.detach().numpy(),
                           (x - lo).detach().numpy(), None, 0.0)
    assert np.isfinite(form.value).all() and np.array_equal(form.d_logp, w * adv.numpy())


def test_r2vpo_dual_ascent_is_the_pid_controller_with_only_an_integral():
    """The projected dual step lambda <- max(0, lambda + eta (v - delta)), transcribed here,
    equals klppo's PID controller with kp = kd = 0 and ki = eta, on a sequence of measured
    variances that drives lambda to the floor and back."""
    from klppo.core.controllers import make_controller

    eta, delta, lam = 5.0, 0.02, 0.3
    ctl = make_controller("pid", beta=lam, target=delta, kp=0.0, ki=eta, kd=0.0)
    g = np.random.default_rng(0)
    for v in np.concatenate([g.uniform(0, 0.01, 40), g.uniform(0.01, 0.2, 60)]):
        lam = max(0.0, lam + eta * (float(v) - delta))
        ctl.update(float(v), n_steps=64)
        assert ctl.value == lam


@pytest.mark.parametrize("delta", [0.15, 0.02])
def test_dppo_binary_tv(delta):
    """DPPO Binary-TV: J = M r A, M = 0 where TV = |pi(a) - mu(a)| > delta and the update
    moves pi(a) in the advantage's direction."""
    w0, lo, adv = token_batch(spread=0.6, probs=True)
    obj = make_objective("dppo_tv", knobs=Knobs(delta=delta))

    def paper(x, r):
        pi, mu = x.detach().exp(), lo.exp()
        tv = (pi - mu).abs()
        out = (tv > delta) & (((adv > 0) & (pi > mu)) | ((adv < 0) & (pi < mu)))
        return torch.where(out, torch.zeros_like(r), r * adv)

    check(obj, paper, w0, lo, adv)
    x, _ = leaf(w0, lo)
    assert bool(((x.exp() - lo.exp()).abs() > delta).any())  # the mask binds somewhere


@pytest.mark.parametrize("delta", [0.05, 0.005])
def test_dppo_binary_kl(delta):
    """DPPO Binary-KL: the divergence is KL(Bern(mu(a)) || Bern(pi(a))), computed here in
    float64 from its definition."""
    w0, lo, adv = token_batch(spread=0.6, probs=True)
    obj = make_objective("dppo_kl", knobs=Knobs(delta=delta))

    def paper(x, r):
        pi, mu = x.detach().double().exp(), lo.double().exp()
        kl = mu * torch.log(mu / pi) + (1 - mu) * torch.log((1 - mu) / (1 - pi))
        out = (kl > delta) & (((adv > 0) & (pi > mu)) | ((adv < 0) & (pi < mu)))
        return torch.where(out, torch.zeros_like(r), r * adv)

    check(obj, paper, w0, lo, adv)


def test_dppo_refuses_log_densities():
    obj = make_objective("dppo_tv")
    x = torch.tensor([0.3, -1.0])
    with pytest.raises(ValueError, match="log-probabilities <= 0"):
        obj.term(torch.ones(2), x, torch.tensor([-0.1, -1.0]), torch.ones(2), None, 0.0)


def covariance_batch(seed=3):
    w0, lo, adv = token_batch(n=400, seed=seed)
    return w0, lo, 3 * adv


def paper_cov(x, adv):
    """Cov(y_i) = (log pi(y_i) - mean_j log pi(y_j)) (A(y_i) - mean_j A(y_j))."""
    lp = x.detach().double()
    a = adv.double()
    return (lp - lp.mean()) * (a - a.mean())


def top(cov, allowed, k):
    order = sorted((i for i in range(len(cov)) if allowed[i]), key=lambda i: -float(cov[i]))
    sel = torch.zeros(len(cov), dtype=torch.bool)
    sel[order[:k]] = True
    return sel


@pytest.mark.parametrize("fraction", [2e-4, 0.05])
def test_clip_cov(fraction):
    """Clip-Cov: PPO-Clip with the gradient of k = max(1, floor(r N)) tokens with
    cov in (omega_low, omega_high), not already clipped, removed (klppo: the largest cov)."""
    w0, lo, adv = covariance_batch()
    obj = make_objective("clip_cov", knobs=Knobs(cov_fraction=fraction))
    k = max(1, math.floor(fraction * len(w0)))

    def paper(x, r):
        cov = paper_cov(x, adv)
        clipped = ((r > 1.2) & (adv > 0)) | ((r < 0.8) & (adv < 0))
        sel = top(cov, ~clipped & (cov > 1) & (cov < 5), k)
        return torch.where(sel, torch.zeros_like(r), torch.min(r * adv, clip(r, 0.2, 0.2) * adv))

    check(obj, paper, w0, lo, adv)
    x, ratio = leaf(w0, lo)
    bt = obj.term(ratio, x, lo, adv, None, 0.0).beta_t
    killed = ((w0 > 1.2) & (adv > 0)) | ((w0 < 0.8) & (adv < 0))
    assert int(((bt != 0) & ~killed).sum()) == k  # exactly k tokens lost their gradient


def test_clip_cov_with_a_generator_draws_uniformly_among_the_candidates():
    """The paper's uniform draw: k distinct candidates, the same for the same seed, and every
    candidate drawn about equally often."""
    w0, lo, adv = covariance_batch()
    x, ratio = leaf(w0, lo)
    cov = paper_cov(x, adv)
    clipped = ((w0 > 1.2) & (adv > 0)) | ((w0 < 0.8) & (adv < 0))
    cand = ~clipped & (cov > 1) & (cov < 5)
    counts = torch.zeros(len(w0))
    for seed in range(400):
        obj = OBJECTIVES["clip_cov"](knobs=Knobs(cov_fraction=0.01),
                                     generator=torch.Generator().manual_seed(seed))
        bt = obj.term(ratio, x, lo, adv, None, 0.0).beta_t
        sel = (bt != 0) & ~clipped
        assert int(sel.sum()) == 4 and not bool((sel & ~cand).any())
        counts += sel
    again = OBJECTIVES["clip_cov"](knobs=Knobs(cov_fraction=0.01),
                                   generator=torch.Generator().manual_seed(399))
    assert torch.equal(again.term(ratio, x, lo, adv, None, 0.0).beta_t, bt)
    expect = 400 * 4 / int(cand.sum())
    assert counts[cand].min() > 0.3 * expect and counts[cand].max() < 2.2 * expect


@pytest.mark.parametrize("fraction, coef", [(2e-3, 1.0), (0.05, 0.3)])
def test_kl_cov(fraction, coef):
    """KL-Cov: r A, minus beta |log r| on the top-k tokens by covariance (the authors' code's
    |log r| for the paper's D_KL)."""
    w0, lo, adv = covariance_batch(seed=4)
    obj = make_objective("kl_cov", knobs=Knobs(cov_fraction=fraction, kl_cov_coef=coef))
    k = max(1, math.floor(fraction * len(w0)))

    def paper(x, r):
        sel = top(paper_cov(x, adv), torch.ones(len(r), dtype=torch.bool), k)
        return r * adv - torch.where(sel, coef * (x - lo).abs(), torch.zeros_like(r))

    check(obj, paper, w0, lo, adv)


# ---------------------------------------------------------------------------- sequence level
def exact_log(target: float) -> float:
    """A float32 log-ratio whose float32 exp is exactly float32(target)."""
    want = torch.tensor(target, dtype=F32)
    v = torch.log(want)
    for _ in range(8):
        e = torch.exp(v)
        if e == want:
            return float(v)
        v = torch.nextafter(v, torch.tensor(math.inf) if e < want else torch.tensor(-math.inf))
    raise AssertionError(target)


def sequence_batch(seed=0, lengths=(8, 4, 16, 1, 4, 8, 2, 4), constant_adv=True, eps=0.2,
                   log_space=False):
    """Flattened tokens of sequences of the given lengths: ``(logp_new, logp_old, adv, ids)``.
    Some sequences sit exactly on the band edges: all their tokens have the same log-ratio
    (``log(1 +- eps)``, or ``+-eps`` in log space) and ``logp_old = 0``."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
    n = len(ids)
    lo = -torch.rand(n, generator=g) * 3 - 0.05
    new = lo + 0.3 * torch.randn(n, generator=g)
    a_seq = 2 * torch.randn(len(lengths), generator=g)
    adv = a_seq[ids] if constant_adv else 2 * torch.randn(n, generator=g)
    edges = [eps, -eps, 0.0] if log_space else [exact_log(1 + eps), exact_log(1 - eps), 0.0]
    for i, e in zip((1, 4, 7), edges):
        m = ids == i
        lo[m], new[m] = 0.0, e
    return new, lo, adv, ids


def seq_grad(fn, new):
    x = new.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(fn(x), x)
    return g


def ours(objective, lo, adv, ids, **kw):
    loss = PPOLoss(objective, normalize_advantage="none", **kw)
    return lambda x: loss(x, lo, adv, sequence_ids=ids)["loss_objective"]


def check_template(objective, new, lo, adv, ids, g_paper, **kw):
    """The gradient of PPOLoss's mean is (w A + beta_t) / N."""
    loss = PPOLoss(objective, normalize_advantage="none", **kw)
    w = torch.exp(new - lo)
    bt = loss.policy.term(w, new, lo, adv, None, 0.0, sequence_ids=ids).beta_t
    assert torch.allclose(-(w * adv + bt) / len(new), g_paper, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("eps_low, eps_high", [(0.2, 0.2), (3e-4, 4e-4)])
def test_gspo_sequence_ratio(eps_low, eps_high):
    """GSPO: s_i = (pi(y_i) / pi_old(y_i))^(1/|y_i|), J = (1/G) sum_i min(s_i A_i,
    clip(s_i, 1 - eps_low, 1 + eps_high) A_i), A_i per sequence; sequences on the edges."""
    new, lo, adv, ids = sequence_batch(eps=eps_high)
    lengths = torch.bincount(ids)

    def paper(x):
        s = torch.exp(torch.zeros(len(lengths)).index_add(0, ids, x - lo) / lengths)
        a = torch.zeros(len(lengths)).index_add(0, ids, adv) / lengths
        return -torch.min(s * a, torch.clamp(s, 1 - eps_low, 1 + eps_high) * a).mean()

    kw = {"eps_low": eps_low, "eps_high": eps_high}
    g_paper = seq_grad(paper, new)
    assert torch.allclose(seq_grad(ours("gspo", lo, adv, ids, **kw), new), g_paper,
                          rtol=1e-5, atol=1e-8)
    check_template("gspo", new, lo, adv, ids, g_paper, **kw)


def test_gspo_token_with_per_token_advantages():
    """GSPO-token: s_it = sg(s_i) pi(y_it) / sg(pi(y_it)), J = (1/G) sum_i (1/|y_i|) sum_t
    min(s_it A_it, clip(s_it) A_it)."""
    new, lo, adv, ids = sequence_batch(constant_adv=False)
    lengths = torch.bincount(ids)

    def paper(x):
        log_s = torch.zeros(len(lengths)).index_add(0, ids, (x - lo).detach()) / lengths
        s_t = torch.exp(log_s[ids] + x - x.detach())
        per_tok = torch.min(s_t * adv, torch.clamp(s_t, 0.8, 1.2) * adv)
        return -(torch.zeros(len(lengths)).index_add(0, ids, per_tok) / lengths).mean()

    g_paper = seq_grad(paper, new)
    kw = dict(eps_low=0.2, eps_high=0.2)  # a symmetric 0.2 is given by its edges (below)
    assert torch.allclose(seq_grad(ours("gspo", lo, adv, ids, **kw), new), g_paper, atol=1e-8)
    check_template("gspo", new, lo, adv, ids, g_paper, **kw)


def test_sequence_objectives_default_to_their_papers_band():
    """GSPO: 3e-4 / 4e-4 on the sequence ratio; GMPO: 0.4 in log space. klppo's default band
    (eps 0.2, no edges) means the paper's; any other band is taken as given."""
    from klppo.core.objective_base import Band
    from klppo.core.objectives import make_objective

    gspo, gmpo = make_objective("gspo").band, make_objective("gmpo").band
    assert (gspo.lo, gspo.hi) == (3e-4, 4e-4) and (gmpo.lo, gmpo.hi) == (0.4, 0.4)
    assert make_objective("gspo", Band(0.1)).band.lo == 0.1
    assert make_objective("gmpo", Band(0.2, 0.2, 0.2)).band.hi == 0.2
    assert make_objective("trm").band.lo == 0.2  # no paper band: klppo's


@pytest.mark.parametrize("eps", [0.4, 0.2])
def test_gmpo(eps):
    """GMPO: J = (1/G) sum_i A_i {prod_t min(r_t, clip(r_t, e^-eps, e^eps)) sign(A)}^(1/|o_i|)
    (in log space: sgn(A) min(sgn(A) log r, sgn(A) clip(log r, -eps, eps))); sequences with
    every token on an edge."""
    new, lo, adv, ids = sequence_batch(eps=eps, log_space=True)
    lengths = torch.bincount(ids)

    def paper(x):
        log_r = x - lo
        sgn = torch.sign(adv)
        m = sgn * torch.min(sgn * log_r, sgn * torch.clamp(log_r, -eps, eps))
        a = torch.zeros(len(lengths)).index_add(0, ids, adv) / lengths
        geo = torch.exp(torch.zeros(len(lengths)).index_add(0, ids, m) / lengths)
        return -(a * geo).mean()

    g_paper = seq_grad(paper, new)
    kw = dict(eps_low=eps, eps_high=eps)  # the default band would be the paper's 0.4
    got = seq_grad(ours("gmpo", lo, adv, ids, **kw), new)
    assert torch.allclose(got, g_paper, rtol=1e-5, atol=1e-8)
    check_template("gmpo", new, lo, adv, ids, g_paper, **kw)


@pytest.mark.parametrize("eps", [0.2, 100.0])
def test_trust_region_masking(eps):
    """TRM: M_i = 1[max_t k2_t <= delta] (k2 = (log r)^2 / 2) on the token surrogate; a large
    eps gives the paper's masked M_i r A. delta sits exactly on one sequence's max."""
    new, lo, adv, ids = sequence_batch(constant_adv=False)
    on_edge = float(((new - lo)[ids == 1] ** 2 / 2).max())
    delta = on_edge

    def paper(x):
        k2 = (x - lo).detach() ** 2 / 2
        mx = torch.full((int(ids.max()) + 1,), -math.inf).scatter_reduce(0, ids, k2, "amax")
        keep = (mx <= delta)[ids]
        r = torch.exp(x - lo)
        return -torch.where(keep, torch.min(r * adv, torch.clamp(r, 1 - eps, 1 + eps) * adv),
                            torch.zeros_like(r)).mean()

    kw = {"eps": eps, "knobs": Knobs(delta=delta)}
    g_paper = seq_grad(paper, new)
    assert bool((g_paper[ids == 1] != 0).any())  # the edge sequence is kept (<=)
    assert bool((g_paper == 0).any())  # and some sequence is masked
    assert torch.allclose(seq_grad(ours("trm", lo, adv, ids, **kw), new), g_paper, atol=1e-8)
    check_template("trm", new, lo, adv, ids, g_paper, **kw)


def test_sequence_objectives_need_sequence_ids_and_token_ones_ignore_them():
    new, lo, adv, ids = sequence_batch()
    for name, cls in OBJECTIVES.items():
        loss = PPOLoss(name, normalize_advantage="none",
                       kl_estimator="k3" if cls.penalised else "analytic")
        if cls.level == "sequence":
            with pytest.raises(ValueError, match="sequence_ids"):
                loss(new, lo, adv)
        elif not cls.needs_probabilities:
            a = loss(new, lo, adv)["loss_objective"]
            assert torch.equal(a, loss(new, lo, adv, sequence_ids=ids)["loss_objective"])


def test_knobs_are_refused_by_objectives_that_do_not_read_them():
    with pytest.raises(ValueError, match="'clip' does not read tau_pos"):
        make_objective("clip", knobs=Knobs(tau_pos=1.0))
    with pytest.raises(ValueError, match="'sapo' does not read delta"):
        make_objective("sapo", knobs=Knobs(delta=0.1))
    with pytest.raises(ValueError, match="tau_neg must be finite and > 0"):
        make_objective("sapo", knobs=Knobs(tau_neg=0.0))
    with pytest.raises(ValueError, match="cov_low must be < cov_high"):
        make_objective("clip_cov", knobs=Knobs(cov_low=5.0, cov_high=1.0))
    with pytest.raises(ValueError, match="cov_fraction must be in"):
        make_objective("kl_cov", knobs=Knobs(cov_fraction=2.0))
    with pytest.raises(ValueError, match="eps_low"):
        make_objective("cispo", Band(0.2, -1.0, 0.2))


def test_every_catalogue_objective_states_its_source():
    """Each class docstring names its paper (an arXiv id) and the formula's beta_t or c_t."""
    classic = {"clip", "per_sample_kl", "kl_penalty", "unclipped", "clip_kl"}
    for name, cls in OBJECTIVES.items():
        if name in classic:
            continue
        doc = " ".join((cls.__doc__ or "").split()) + " ".join(
            (c.__doc__ or "") for c in cls.__mro__[1:2])
        assert "arXiv:" in doc, name
        assert "c_t" in doc or "beta_t" in doc, name


@pytest.mark.parametrize("constant_adv", [True, False])
def test_topr_tapers_only_the_negative_samples(constant_adv):
    """TOPR (arXiv:2503.14286): J = (1/G) sum_i [R_i >= 0] R_i log pi(y_i)
    + [R_i < 0] sg(clip(pi(y_i) / mu(y_i), 0, 1)) R_i log pi(y_i), the trajectory ratio a
    product over tokens and log pi(y_i) a sum; with per-token advantages, each token's sign."""
    new, lo, adv, ids = sequence_batch(seed=1, constant_adv=constant_adv)
    lengths = torch.bincount(ids)
    g = len(lengths)

    def paper(x):
        rho = torch.exp(torch.zeros(g).index_add(0, ids, (x - lo).detach()))[ids]
        weight = torch.where(adv >= 0, torch.ones_like(rho), torch.clamp(rho, 0, 1))
        return -torch.zeros(g).index_add(0, ids, weight * adv * x).sum() / g

    g_paper = seq_grad(paper, new)
    assert torch.allclose(seq_grad(ours("topr", lo, adv, ids), new), g_paper, rtol=1e-5,
                          atol=1e-8)
    check_template("topr", new, lo, adv, ids, g_paper)
    # every case occurs: negative with rho below 1 (tapered) and above 1 (truncated at 1),
    # positive with rho below 1 (not tapered)
    rho = torch.exp(torch.zeros(g).index_add(0, ids, new - lo))[ids]
    assert ((adv < 0) & (rho < 1)).any() and ((adv < 0) & (rho > 1)).any()
    assert ((adv > 0) & (rho < 1)).any()


def test_topr_is_finite_where_the_trajectory_ratio_overflows():
    ids = torch.zeros(200, dtype=torch.long)
    lo, new = torch.zeros(200), torch.full((200,), 5.0)  # rho = e^1000
    for sign in (1.0, -1.0):
        adv = torch.full((200,), sign)
        out = PPOLoss("topr", normalize_advantage="none")(new.requires_grad_(True), lo, adv,
                                                          sequence_ids=ids)
        (g,) = torch.autograd.grad(out["loss_objective"], new)
        assert torch.isfinite(g).all() and torch.allclose(g, torch.full((200,), -sign))


@pytest.mark.parametrize("name", ["gspo", "gmpo", "trm", "topr"])
def test_sequences_of_one_token_are_the_tokens_themselves_without_the_one_hot(name):
    """Every token its own sequence (``klppo train``'s steps, in any order of ids): the segment
    sums, means and maxima are the tokens (a permutation), the one-hot ``[S, N]`` matrix is
    never made, and every sequence objective's value and gradient equal those computed through
    it (forced), bit for bit."""
    from klppo.core.sequence_objectives import Segments

    g = torch.Generator().manual_seed(3)
    n = 257
    ids = torch.randperm(n, generator=g) + 5
    seg = Segments(ids)
    x = torch.randn(n, generator=g)
    assert seg.singletons and seg._onehot is None
    order = torch.argsort(seg.ids)
    for got in (seg.sum(x), seg.mean(x), seg.max(x)):
        assert torch.equal(got, x[order])
    assert seg._onehot is None
    logp_old = -torch.rand(n, generator=g) - 0.1
    logp = (logp_old + 0.3 * torch.randn(n, generator=g)).requires_grad_(True)
    adv = torch.randn(n, generator=g)
    obj = make_objective(name, Band(0.2))

    def value_and_grad(force_one_hot):
        if force_one_hot:
            real = Segments.__init__

            def init(self, ids):
                real(self, ids)
                self._token_of, self.singletons = None, False
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(Segments, "__init__", init)
                term = obj.term(torch.exp(logp - logp_old), logp, logp_old, adv, None, 0.0,
                                sequence_ids=ids)
        else:
            term = obj.term(torch.exp(logp - logp_old), logp, logp_old, adv, None, 0.0,
                            sequence_ids=ids)
        (grad,) = torch.autograd.grad(term.objective.sum(), logp)
        return term.objective.detach(), grad

    for a, b in zip(value_and_grad(False), value_and_grad(True)):
        assert torch.equal(a, b)
