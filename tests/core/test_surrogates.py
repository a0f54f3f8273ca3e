import math

import pytest
import torch
from hypothesis import event, given
from hypothesis import strategies as st

from klppo.core import surrogates as S
from klppo.core.kl import sampled_kl


def batch(n, gen, spread=0.35, dtype=torch.float32):
    logp_old = (-torch.rand(n, generator=gen) * 3 - 0.05).to(dtype)
    logp_new = logp_old + spread * torch.randn(n, generator=gen).to(dtype)
    adv = torch.randn(n, generator=gen).to(dtype)
    return logp_new, logp_old, adv


def grad_of(fn, logp_new):
    x = logp_new.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(fn(x).mean(), x)
    return g


def clip_fn(logp_old, adv, **kw):
    return lambda x: S.clip_objective(torch.exp(x - logp_old), adv, **kw)


def tmpl_fn(logp_old, adv, **kw):
    return lambda x: S.per_sample_kl_objective(x, logp_old, adv, **kw)


# ----------------------------------------------------------------------------- Theorem 1
@pytest.mark.parametrize("n", [16, 64, 256, 1024, 4096])
def test_theorem1_bit_identical_for_power_of_two_batches(n):
    gen = torch.Generator().manual_seed(n)
    for _ in range(100):
        lp, lo, a = batch(n, gen)
        in_, pass_, kill = S.partition(torch.exp(lp - lo), a)
        if n >= 64:  # every part present, for both signs of A
            for m in (in_, pass_, kill):
                assert bool((m & (a > 0)).any()) and bool((m & (a < 0)).any())
        assert torch.equal(grad_of(clip_fn(lo, a), lp), grad_of(tmpl_fn(lo, a), lp))


SUBNORMAL = 2.0**-149  # smallest positive float32: the spacing of float32's subnormal grid
TINY = torch.finfo(torch.float32).smallest_normal  # 2**-126


def theorem1_tolerance(w, a, n):
    """How far apart float32 rounding may put the clip and template gradients of one sample.

    The two gradients are the same real number (Theorem 1). Each is a few float32 products of
    ``g = 1/n`` (from the mean), ``A`` and ``w``; a rounding ``fl(x) = x (1 + d) + e`` errs by
    ``|d| <= u = 2**-24`` relative or, when the result is subnormal, ``|e| <= SUBNORMAL / 2``
    absolute (not relative: that is why a purely relative tolerance underflows to 0 and fails
    for a tiny ``A``, e.g. the smallest normal -1.18e-38 divided by n). Per region:

    * kill: clip gives exactly 0; the template gives ``fl(fl(g A) w) - fl(g fl(w A))``, at most
      ``4.01 u |w A| / n + (w + g + 2) SUBNORMAL / 2 < 4.01 u |w A| / n + 2.62 SUBNORMAL``
      (``w < e**0.8``, ``g <= 1``);
    * in band: clip sends ``g / 2`` down both branches of the min (a tie), giving
      ``fl(2 fl(g A / 2) w)`` against the template's ``fl(fl(g A) w)``; the two factors differ
      by at most one SUBNORMAL, so the results by ``w SUBNORMAL`` plus two roundings:
      ``< 2 u |w A| / n + 2.3 SUBNORMAL`` (``w <= 1.3`` in band);
    * pass: both compute ``fl(fl(g A) w)``: identical.

    The relative part is ``1e-6`` (about 16 u, four times the bound) and the absolute floor is
    3 SUBNORMAL, just above the 2.62 derived (differences of 2 SUBNORMAL do occur). Computed in
    float64, so that the tolerance itself cannot underflow.
    """
    return 1e-6 * (w.double() * a.double()).abs() / n + 3 * SUBNORMAL


@pytest.mark.parametrize("n", [3, 100, 1000, 3000])
def test_theorem1_within_1e6_relative_otherwise(n):
    gen = torch.Generator().manual_seed(n)
    residual = 0
    for _ in range(50):
        lp, lo, a = batch(n, gen)
        g1, g2 = grad_of(clip_fn(lo, a), lp), grad_of(tmpl_fn(lo, a), lp)
        tol = theorem1_tolerance(torch.exp(lp - lo), a, n)
        assert bool(((g1.double() - g2.double()).abs() <= tol).all())
        residual += int((g1 != g2).sum())
    assert residual > 0  # not a power of two: some ulp-level residuals do appear


def test_theorem1_bit_identical_through_network_parameters():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    obs = torch.randn(128, 5)
    act = torch.randint(0, 4, (128,))
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.0)
        logp_old = torch.log_softmax(net(obs) + 0.5 * torch.randn(128, 4), -1).gather(
            -1, act[:, None]).squeeze(-1)
    adv = torch.randn(128)

    def grads(objective):
        net.zero_grad()
        logp = torch.log_softmax(net(obs), -1).gather(-1, act[:, None]).squeeze(-1)
        (-objective(logp).mean()).backward()
        return [p.grad.clone() for p in net.parameters()]

    g_clip = grads(clip_fn(logp_old, adv))
    g_tmpl = grads(tmpl_fn(logp_old, adv))
    assert all(torch.equal(x, y) for x, y in zip(g_clip, g_tmpl))


def test_theorem1_needs_detached_beta_and_sampled_logp():
    gen = torch.Generator().manual_seed(7)
    lp, lo, a = batch(256, gen)
    g_clip = grad_of(clip_fn(lo, a), lp)

    def attached(x):  # beta_t NOT detached
        w = torch.exp(x - lo)
        _, _, kill = S.partition(w, a)
        return w * a + torch.where(kill, -w * a, torch.zeros(())) * x

    assert not torch.allclose(grad_of(attached, lp), g_clip, atol=1e-4)

    def analytic(x):  # the per-state analytic KL of a 2-action policy replaces logp_new
        w = torch.exp(x - lo)
        beta = S.per_sample_beta(w, a)
        p_new, p_old = x.exp().clamp(max=0.999), lo.exp().clamp(max=0.999)
        kl = p_old * (lo - x) + (1 - p_old) * (torch.log1p(-p_old) - torch.log1p(-p_new))
        return w * a - beta * kl

    assert not torch.allclose(grad_of(analytic, lp), g_clip, atol=1e-4)


def nudge(x, k):
    """The float32 ``k`` steps above float32(x) (below for k < 0), as a Python float."""
    t = torch.tensor(x, dtype=torch.float32)
    towards = torch.tensor(math.inf if k > 0 else -math.inf)
    for _ in range(abs(k)):
        t = torch.nextafter(t, towards)
    return float(t)


def lp_with_ratio(lo, target):
    """A float32 logp_new with float32 ``exp(logp_new - lo) == target`` where one exists (the
    float32 exp skips some values), else the one whose ratio is nearest ``target``."""
    lp = torch.tensor(float(lo) + math.log(target), dtype=torch.float32)
    candidates = [lp]
    for towards in (math.inf, -math.inf):
        c = lp
        for _ in range(4):
            c = torch.nextafter(c, torch.tensor(towards))
            candidates.append(c)
    return min(candidates, key=lambda c: abs(float(torch.exp(c - lo)) - target))


#: a ratio at a band edge: (side, k) puts w k float32 steps from 1 + side * eps
EDGE = st.tuples(st.sampled_from([-1, 1]), st.integers(-2, 2))


@given(st.lists(st.tuples(st.floats(-2, 2), st.floats(-0.8, 0.8) | EDGE,
                          st.floats(-5, 5, width=32)), min_size=1, max_size=64),
       st.sampled_from([0.1, 0.2, 0.3]))
def test_theorem1_property(rows, eps):
    """Theorem 1 on any float32 batch: advantages anywhere in [-5, 5] including subnormals and
    zeros of both signs, ratios anywhere in [e**-0.8, e**0.8] and exactly on (or a few float32
    steps off) either band edge. No product can overflow (``|w A| < 12``) and nothing is
    infinite, so the only float32 hazards are rounding and underflow; see
    :func:`theorem1_tolerance` for the bound, and below for the one case outside the theorem.
    """
    n = len(rows)
    lo = torch.tensor([r[0] for r in rows]) - 3
    lp = lo + torch.tensor([0.0 if isinstance(r[1], tuple) else r[1] for r in rows])
    for i, (_, d, _) in enumerate(rows):
        if isinstance(d, tuple):
            side, k = d
            lp[i] = lp_with_ratio(lo[i], nudge(1 + side * eps, k))
    a = torch.tensor([r[2] for r in rows])
    w = torch.exp(lp - lo)
    clipped = torch.clamp(w, 1 - eps, 1 + eps)  # as clip_objective computes it
    # Outside the theorem, excluded: w strictly outside the band while w A and clip(w) A round
    # to the same float32 (w within a float32 step of an edge, or A subnormal). The float32 min
    # form is then at a tie, and autograd's min sends half the gradient down each branch: half
    # the unclipped gradient, neither PPO-Clip's kill gradient (0) nor its pass gradient (all).
    # In the reals w A != clip(w) A there, so this is a rounding artefact of the min form.
    tie = (w != clipped) & (a != 0) & (w * a == clipped * a)
    g1 = grad_of(clip_fn(lo, a, eps=eps), lp).double()
    g2 = grad_of(tmpl_fn(lo, a, eps=eps), lp).double()
    assert bool(((g1 - g2).abs() <= theorem1_tolerance(w, a, n))[~tie].all())
    # what the run reached (shown by --hypothesis-show-statistics)
    on_edge = (w == nudge(1 + eps, 0)) | (w == nudge(1 - eps, 0))
    for reached, name in ((on_edge, "w exactly on a band edge"), (tie, "a min-form tie (excluded)"),
                          ((a != 0) & (a.abs() < TINY), "a subnormal A"),
                          (g1 != g2, "gradients differ (within tolerance)")):
        if bool(reached.any()):
            event(name)
    if n & (n - 1) == 0:
        # Bit identity needs g = 1/n (and the min's g/2) to scale exactly, i.e. every product
        # on either path (g A / 2, g A, w A, g A w) to be a normal float32: |A| min(w, 1/2) / n
        # >= the smallest normal. Below that the products round on the subnormal grid and
        # differ by up to theorem1_tolerance's floor (checked above).
        normal = a.double().abs() * torch.clamp(w.double(), max=0.5) / n >= TINY
        exact = normal & ~tie
        assert torch.equal(g1[exact], g2[exact])


# ----------------------------------------------------------------------------- Theorem 2
@given(st.lists(st.tuples(st.floats(0.01, 5), st.floats(-10, 10)), min_size=1, max_size=50),
       st.floats(0.01, 0.9))
def test_theorem2_phi_form_equals_min_form_in_value(rows, eps):
    w = torch.tensor([r[0] for r in rows], dtype=torch.float64)
    a = torch.tensor([r[1] for r in rows], dtype=torch.float64)
    phi = S.phi_penalty(w, a, eps)
    assert bool((phi >= 0).all())
    # float64, |w A| <= 50: each side is a few roundings of size <= 2**-53 * 50 ~ 6e-15, so the
    # sides differ by < 3e-14; atol 1e-12 is that with margin, and never 0 (rtol is not used).
    assert torch.allclose(S.clip_objective(w, a, eps), w * a - phi, rtol=0, atol=1e-12)


def test_theorem2_hand_values_and_float32():
    w = torch.tensor([1.5, 0.5, 1.5, 0.5, 1.1])
    a = torch.tensor([2.0, -2.0, -2.0, 2.0, 3.0])
    # kill up: (1.5 - 1.2) * 2 = 0.6; kill down: (0.5 - 0.8) * -2 = 0.6; pass and in: 0
    assert torch.allclose(S.phi_penalty(w, a), torch.tensor([0.6, 0.6, 0, 0, 0]))
    gen = torch.Generator().manual_seed(0)
    lp, lo, adv = batch(100_000, gen, spread=0.5)
    r = torch.exp(lp - lo)
    min_form = S.clip_objective(r, adv)
    diff = (min_form - (r * adv - S.phi_penalty(r, adv))).abs()
    scale = torch.maximum((r * adv).abs(), min_form.abs())  # float32 rounding of the operands
    assert bool((diff <= 4 * torch.finfo(torch.float32).eps * scale).all())


# ----------------------------------------------------------------------------- partition
def test_partition_hand_cases_and_cover():
    w = torch.tensor([1.3, 1.3, 0.7, 0.7, 1.0, 1.3, 1.2])
    a = torch.tensor([1.0, -1.0, -1.0, 1.0, 5.0, 0.0, 1.0])
    in_, pass_, kill = S.partition(w, a)
    assert kill.tolist() == [True, False, True, False, False, False, False]
    assert pass_.tolist() == [False, True, False, True, False, False, False]
    assert in_.tolist() == [False, False, False, False, True, True, True]
    gen = torch.Generator().manual_seed(1)
    lp, lo, adv = batch(5000, gen)
    parts = S.partition(torch.exp(lp - lo), adv, eps_low=0.1, eps_high=0.28)
    total = sum(p.int() for p in parts)
    assert torch.equal(total, torch.ones(5000, dtype=torch.int))
    d = S.harm_distance(torch.exp(lp - lo), adv, eps_low=0.1, eps_high=0.28)
    assert torch.equal(d > 0, parts[2])


# ----------------------------------------------------------------------------- shapes
def test_linear_ramp_check_value():
    w, a = torch.tensor([1.21], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64)
    beta = S.per_sample_beta(w, a, 0.2, "linear_ramp", 0.1)
    assert beta.item() == pytest.approx(-1.21 * 0.1)  # gate 0.1
    wv = w.clone().requires_grad_(True)
    logp_old = torch.zeros(1, dtype=torch.float64)
    obj = S.per_sample_kl_objective(torch.log(wv), logp_old, a, 0.2, "linear_ramp", 0.1)
    (dobj_dw,) = torch.autograd.grad(obj.sum(), wv)
    assert dobj_dw.item() == pytest.approx(0.9, abs=1e-12)


@pytest.mark.parametrize("shape", ["linear_ramp", "sigmoid", "soft_min", "asymmetric"])
def test_soft_shapes_limits(shape):
    gen = torch.Generator().manual_seed(3)
    lp, lo, a = batch(512, gen, dtype=torch.float64)
    w = torch.exp(lp - lo)
    kw = {"eps_high": 0.2} if shape == "asymmetric" else {}
    far = S.harm_distance(w, a).abs() > 1e-3
    far &= ((w - 1.2).abs() > 1e-3) & ((w - 0.8).abs() > 1e-3)
    g_hard = grad_of(clip_fn(lo, a), lp)
    g_unclipped = grad_of(lambda x: torch.exp(x - lo) * a, lp)
    g0 = grad_of(tmpl_fn(lo, a, shape=shape, softness=1e-7, **kw), lp)
    ginf = grad_of(tmpl_fn(lo, a, shape=shape, softness=1e7, **kw), lp)
    assert torch.allclose(g0[far], g_hard[far], atol=1e-10)
    assert torch.allclose(ginf, g_unclipped, atol=1e-6)
    mid = grad_of(tmpl_fn(lo, a, shape=shape, softness=0.1, **kw), lp)
    assert not torch.allclose(mid, g_hard) and not torch.allclose(mid, g_unclipped)


def test_sigmoid_matches_the_plain_sigmoid_gate_at_small_softness():
    """klppo's gate sigmoid(d/s - s) against the plain sigmoid(d/s): within 3% at s = 0.05."""
    gen = torch.Generator().manual_seed(4)
    lp, lo, a = batch(1000, gen, dtype=torch.float64)
    w = torch.exp(lp - lo)
    d = S.harm_distance(w, a)
    plain = torch.where(a == 0, 0.0, -w * a * torch.sigmoid(torch.clamp(d / 0.05, -60, 60)))
    ours = S.per_sample_beta(w, a, shape="sigmoid", softness=0.05)
    assert float((ours - plain).abs().max()) < 0.03 * float(plain.abs().max())


def test_template_beta_of_surrogates_matches_shapes():
    gen = torch.Generator().manual_seed(5)
    lp, lo, a = batch(2048, gen, dtype=torch.float64)
    w = torch.exp(lp - lo)
    far = ((w - 1.2).abs() > 1e-6) & ((w - 0.8).abs() > 1e-6)
    clip_beta = S.template_beta(lambda r, adv: S.clip_objective(r, adv), w, a)
    assert torch.allclose(clip_beta[far], S.per_sample_beta(w, a)[far], atol=1e-12)
    spo = lambda r, adv: r * adv - adv.abs() / (2 * 0.2) * (r - 1) ** 2  # noqa: E731
    assert torch.allclose(S.template_beta(spo, w, a), S.per_sample_beta(w, a, shape="spo"))
    # dual clip: the template gradient equals the dual-clip objective's gradient
    far &= (w - 3.0).abs() > 1e-6
    g_dual = grad_of(clip_fn(lo, a, dual_clip=3.0), lp * 1)
    lp_big = lo + 2.0 * (lp - lo)  # spread so some samples pass w > 3
    g_dual = grad_of(clip_fn(lo, a, dual_clip=3.0), lp_big)
    g_t = grad_of(tmpl_fn(lo, a, dual_clip=3.0), lp_big)
    assert bool(((torch.exp(lp_big - lo) > 3) & (a < 0)).any())
    assert torch.allclose(g_dual, g_t, atol=1e-12)


def test_asymmetric_and_position_aware_bands():
    gen = torch.Generator().manual_seed(6)
    lp, lo, a = batch(1024, gen)
    g1 = grad_of(clip_fn(lo, a, eps_low=0.2, eps_high=0.28), lp)
    g2 = grad_of(tmpl_fn(lo, a, shape="asymmetric"), lp)  # DAPO default eps_high 0.28
    assert torch.equal(g1, g2)
    eps_t = torch.linspace(0.1, 0.3, 1024)
    g3 = grad_of(clip_fn(lo, a, eps=eps_t), lp)
    g4 = grad_of(tmpl_fn(lo, a, eps=eps_t), lp)
    assert torch.equal(g3, g4)
    callable_shape = lambda r, adv: S.per_sample_beta(r, adv)  # noqa: E731
    assert torch.equal(grad_of(tmpl_fn(lo, a, shape=callable_shape), lp),
                       grad_of(clip_fn(lo, a), lp))


# ----------------------------------------------------------------------------- invariances
def test_invariances():
    gen = torch.Generator().manual_seed(8)
    lp, lo, a = batch(256, gen)
    w = torch.exp(lp - lo)
    kl = sampled_kl(lo, lp, "k3")
    assert torch.equal(S.kl_penalty_objective(w, a, kl, 0.0), S.unclipped_objective(w, a))
    assert torch.equal(S.clip_objective(w, a, eps=1e9), S.unclipped_objective(w, a))
    g_kl0 = grad_of(lambda x: S.kl_penalty_objective(torch.exp(x - lo), a,
                                                     sampled_kl(lo, x, "k1"), 0.0), lp)
    assert torch.equal(g_kl0, grad_of(lambda x: torch.exp(x - lo) * a, lp))
    # scalar PPO-KL with sampled k1 is the template with constant beta_t = beta
    beta = 0.37
    g_pen = grad_of(lambda x: S.kl_penalty_objective(torch.exp(x - lo), a,
                                                     sampled_kl(lo, x, "k1"), beta), lp)
    g_tpl = grad_of(tmpl_fn(lo, a, shape=lambda r, adv: torch.full_like(r, beta)), lp)
    assert torch.allclose(g_pen, g_tpl, atol=1e-7)


# ----------------------------------------------------------------------------- misuse
def test_shape_misuse_and_non_finite_raise():
    x = torch.zeros(8)
    with pytest.raises(ValueError, match=r"shape mismatch.*\(8,\).*\(8, 1\)"):
        S.clip_objective(x, torch.zeros(8, 1))
    with pytest.raises(ValueError, match="shape mismatch"):
        S.per_sample_kl_objective(x, x, torch.zeros(8, 1))
    with pytest.raises(ValueError, match="non-finite"):
        S.clip_objective(torch.tensor([1.0, math.inf]), torch.zeros(2))
    with pytest.raises(ValueError, match="softness"):
        S.per_sample_beta(x, x, shape="sigmoid")
    with pytest.raises(ValueError, match="shape must be one of"):
        S.per_sample_beta(x, x, shape="cubic")
    with pytest.raises(ValueError, match="eps"):
        S.clip_objective(x, x, eps=-0.1)
    with pytest.raises(ValueError, match="dual_clip"):
        S.clip_objective(x, x, dual_clip=0.5)
