"""BAPO's adaptive clip bounds (arXiv:2510.18927): klppo's controller against Algorithm 1 and
Eq. 8 transcribed here from the paper, in exact rational arithmetic, on random batches.

The transcription (:func:`paper_bapo`) follows the paper's lines: start at (a-, a+); while the
positive contribution is below rho_0 and ``c_low + d2 <= b-``: raise ``c_high`` by ``d1`` if
``c_high + d1 <= b+``, else ``c_low`` by ``d2``. The bounds are kept as exact fractions of the
decimal hyperparameters (so ``0.6 + 15 * 0.02`` is 9/10), the contributions are summed per
sample with ``math.fsum`` from Eq. 8's ``min(w A, clip(w, ...) A)`` (not from the closed forms
the controller uses)."""

import math
from fractions import Fraction

import numpy as np
import pytest

from klppo.core.bound_controllers import (
    BAPO_DEFAULTS,
    BalanceStats,
    BAPOController,
    positive_share,
)


def clip(x, lo, hi):
    return min(max(x, lo), hi)


def paper_share(w, a, c_low, c_high):
    """Eq. 8 over sampled tokens: |positive terms| / (|positive terms| + |negative terms|),
    each term min(w A, clip(w, lo, hi) A) (0 and c_high for the numerator, as printed)."""
    pos = math.fsum(min(wi * ai, clip(wi, 0.0, c_high) * ai) for wi, ai in zip(w, a) if ai > 0)
    neg = math.fsum(-min(wi * ai, clip(wi, c_low, c_high) * ai)
                    for wi, ai in zip(w, a) if ai < 0)
    return 1.0 if neg == 0 else pos / (pos + neg)


def paper_bapo(w, a, rho0, low, high, d1, d2):
    """Algorithm 1, lines 9-17, on one batch; hyperparameters as decimal strings."""
    am, bm = Fraction(low[0]), Fraction(low[1])
    ap, bp = Fraction(high[0]), Fraction(high[1])
    d1, d2 = Fraction(d1), Fraction(d2)
    c_low, c_high = am, ap
    share = lambda: paper_share(w, a, float(c_low), float(c_high))  # noqa: E731
    while share() < float(rho0) and c_low + d2 <= bm:
        if c_high + d1 <= bp:
            c_high = c_high + d1
        else:
            c_low = c_low + d2
    return float(c_low), float(c_high)


SETTINGS = {
    # section 5's settings
    "paper": ("0.4", ("0.6", "0.9"), ("1.2", "3.0"), "0.05", "0.02"),
    # appendix A (OctoThinker-Llama): low 0.8-0.9, high 1.2-2.0, target 0.45
    "appendix": ("0.45", ("0.8", "0.9"), ("1.2", "2.0"), "0.05", "0.02"),
    # the authors' README: target 0.5; a narrow upper range that is used up quickly
    "readme_narrow": ("0.5", ("0.6", "0.9"), ("1.2", "1.3"), "0.05", "0.05"),
    "coarse": ("0.55", ("0.5", "0.95"), ("1.1", "1.7"), "0.1", "0.15"),
}


def controller(setting):
    rho0, low, high, d1, d2 = SETTINGS[setting]
    return BAPOController(float(rho0), tuple(map(float, low)), tuple(map(float, high)),
                          float(d1), float(d2))


def batches(seed, n_batches=60, near=None):
    """Minibatches as a training loop makes them: ratios from small to stale policy moves
    (some exactly 1, as on a first minibatch), advantages of either mean sign, some 0. With
    ``near=(rho0, c_low, c_high)`` every other batch has its positive advantages scaled so that
    its share at those bounds is just below rho0 (where the search stops part way)."""
    rng = np.random.default_rng(seed)
    for k in range(n_batches):
        n = int(rng.integers(1, 200))
        spread = [0.0, 0.05, 0.3, 1.0][k % 4]
        w = np.exp(rng.normal(0, spread, n)).astype(np.float32)
        a = rng.normal(rng.uniform(-1, 1), rng.uniform(0.1, 3), n).astype(np.float32)
        a[rng.random(n) < 0.05] = 0
        if near is not None and k % 2 and (a > 0).any() and (a < 0).any():
            rho0, c_low, c_high = near
            p = float(np.sum(a[a > 0] * np.minimum(w[a > 0], c_high)))
            m = float(np.sum(-a[a < 0] * np.maximum(w[a < 0], c_low)))
            goal = rho0 * rng.uniform(0.8, 1.0)
            a[a > 0] *= np.float32(goal / (1 - goal) * m / p)
        yield w, a


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bounds_equal_the_papers_algorithm_on_random_batches(setting, seed):
    c = controller(setting)
    rho0, low, high = (float(x) for x in (SETTINGS[setting][0], SETTINGS[setting][1][0],
                                          SETTINGS[setting][2][0]))
    seen = set()
    for w, a in batches(seed, near=(rho0, low, high)):
        wl, al = [float(x) for x in w], [float(x) for x in a]
        expect = paper_bapo(wl, al, *SETTINGS[setting])
        got = c.update(BalanceStats.from_samples(w, a))
        assert got == expect
        assert c.edges == (1.0 - expect[0], expect[1] - 1.0)
        assert c.info.share == pytest.approx(paper_share(wl, al, *expect), rel=1e-12)
        assert c.info.met == (c.info.share >= float(SETTINGS[setting][0]))
        seen.add(got)
    # (readme_narrow's upper range has 3 points: few outcomes exist)
    assert len(seen) >= (2 if setting == "readme_narrow" else 4), "the bounds must move"


def test_share_of_a_hand_computed_batch():
    # A > 0: w = 0.5, 2.0 with A = 1, 2; A < 0: w = 0.7, 1.5 with A = -1, -3; A = 0 ignored
    w, a = [0.5, 2.0, 0.7, 1.5, 9.0], [1.0, 2.0, -1.0, -3.0, 0.0]
    # at (0.8, 1.2): P = 1 * 0.5 + 2 * 1.2 = 2.9; N = 1 * 0.8 + 3 * 1.5 = 5.3
    assert positive_share(w, a, 0.8, 1.2) == pytest.approx(2.9 / 8.2, rel=1e-15)
    # at (0.6, 3.0): P = 0.5 + 4 = 4.5; N = 0.7 + 4.5 = 5.2
    assert positive_share(w, a, 0.6, 3.0) == pytest.approx(4.5 / 9.7, rel=1e-15)
    assert positive_share([1.0, 2.0], [1.0, 0.0], 0.8, 1.2) == 1.0  # no negative term
    assert positive_share([1.0], [-2.0], 0.8, 1.2) == 0.0


def test_a_hand_computed_search():
    """rho at the start is 2.9 / (2.9 + N) with c_high 1.2; the target 0.45 needs P >= 0.45 /
    0.55 N: c_high rises in 0.05 steps until 0.5 + 2 c_high >= (0.45 / 0.55) (0.6 + 4.5)."""
    w, a = [0.5, 2.0, 0.7, 1.5], [1.0, 2.0, -1.0, -3.0]
    c = BAPOController(0.45, (0.6, 0.9), (1.2, 3.0))
    # N at c_low 0.6 = 0.7 + 4.5 = 5.2 -> need P >= 4.2545...: 2 c_high >= 3.7545 -> 1.9 (> 2.0
    # caps at w = 2: P = 4.5 at c_high >= 2.0); c_high = 1.9 gives P = 4.3 >= 4.2545
    assert c.update(BalanceStats.from_samples(w, a)) == (0.6, 1.9)
    assert c.info.moves == 14 and c.info.met
    # an unreachable target ends at (b-, b+), unmet
    c = BAPOController(0.9, (0.6, 0.9), (1.2, 3.0))
    assert c.update(BalanceStats.from_samples(w, a)) == (0.9, 3.0)
    assert c.info.moves == 36 + 15 and not c.info.met


def test_raising_c_low_never_raises_the_share():
    """The property the module docstring states (Eq. 8 counts |A| max(w, c_low))."""
    for w, a in batches(7, 40):
        s = BalanceStats.from_samples(w, a)
        shares = [s.share(c, 1.5) for c in np.linspace(0.5, 0.99, 30)]
        assert all(x >= y for x, y in zip(shares, shares[1:]))


def test_grid_reaches_the_max_where_float_accumulation_does_not():
    c = BAPOController()
    assert c._lows[-1] == 0.9 and len(c._lows) == 16
    assert c._highs[-1] == 3.0 and len(c._highs) == 37
    acc, n = 0.6, 0
    while acc + 0.02 <= 0.9:
        acc, n = acc + 0.02, n + 1
    assert n == 14  # what c += d2 would give


def test_defaults_are_the_papers():
    assert BAPO_DEFAULTS == {"target": 0.4, "low": (0.6, 0.9), "high": (1.2, 3.0),
                             "step_high": 0.05, "step_low": 0.02}
    c = BAPOController()
    assert c.bounds == (0.6, 1.2) and c.edges == (1 - 0.6, 1.2 - 1)


def test_state_dict_round_trip_and_refusals():
    c = controller("paper")
    w, a = next(batches(3))
    c.update(BalanceStats.from_samples(w, a))
    twin = controller("paper")
    twin.load_state_dict(c.state_dict())
    assert twin.bounds == c.bounds and twin.info == c.info and twin.num_updates == 1
    with pytest.raises(ValueError, match="made with settings"):
        controller("appendix").load_state_dict(c.state_dict())
    with pytest.raises(ValueError, match="is for 'rsl_rl'"):
        twin.load_state_dict({"name": "rsl_rl"})


@pytest.mark.parametrize("kwargs, message", [
    ({"target": 0.0}, "target=0.0: must be in (0, 1]"),
    ({"target": 1.5}, "target=1.5"),
    ({"target": float("nan")}, "target=nan"),
    ({"low": (0.9, 0.6)}, "low=(0.9, 0.6): the start must not exceed the max"),
    ({"low": (0.6, 1.0)}, "low=1.0: c_low must be in (0, 1)"),
    ({"low": (0.6,)}, "low=(0.6,): must be a pair"),
    ({"high": (0.9, 2.0)}, "high=0.9: c_high must be finite and > 1"),
    ({"high": (1.2, float("inf"))}, "high=inf"),
    ({"step_high": 0.0}, "step_high=0.0: must be finite and > 0"),
    ({"step_low": 0.5}, "low=(0.6, 0.9): b- - a- must allow one step of step_low=0.5"),
])
def test_bad_settings_are_one_line(kwargs, message):
    with pytest.raises(ValueError) as e:
        BAPOController(**kwargs)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("w, a, message", [
    ([1.0, 2.0], [1.0], "ratio has shape (2,) but advantage has shape (1,)"),
    ([1.0, float("nan")], [1.0, 1.0], "ratio holds a non-finite value at index 1"),
    ([1.0], [float("inf")], "advantage holds a non-finite value at index 0"),
    ([-0.1], [1.0], "ratio must be >= 0"),
    ([], [], "non-empty 1-d"),
    ([[1.0]], [[1.0]], "non-empty 1-d"),
])
def test_bad_statistics_are_one_line(w, a, message):
    with pytest.raises(ValueError) as e:
        BalanceStats.from_samples(np.array(w), np.array(a))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_sorted_profile_equals_the_direct_sums_on_and_off_the_grid():
    """The controller reads P and N from prefix sums over sorted ratios; they equal the direct
    sums of Eq. 8's closed forms, ratios exactly on grid points (1.2, 0.9, 1.0) included."""
    c = BAPOController()
    for w, a in batches(11, 30):
        w = w.astype(np.float64)  # 1.2 and 0.9 exactly, as the grid has them
        w[: len(w) // 3] = 1.2
        w[len(w) // 3: len(w) // 2] = 0.9
        s = BalanceStats.from_samples(w, a)
        n, p = s.profile(c._lows, c._highs)
        for j, lo in enumerate(c._lows):
            assert n[j] == pytest.approx(s.contributions(lo, 2.0)[1], rel=1e-12, abs=1e-12)
        for i, hi in enumerate(c._highs):
            assert p[i] == pytest.approx(s.contributions(0.7, hi)[0], rel=1e-12, abs=1e-12)


def test_a_step_that_makes_too_many_bounds_is_refused_before_they_are_made():
    """(issue #32) A step of 1e-12 over BAPO's range would build 1.8e12 bounds (memory grows
    without a word): refused, naming the step, in a moment."""
    import time

    from klppo.core.bound_controllers import MAX_GRID

    t = time.perf_counter()
    for kw, name in (({"step_high": 1e-12}, "step_high=1e-12"),
                     ({"high": (1.2, 1e15)}, "step_high=0.05"),
                     ({"step_low": 1e-9}, "step_low=1e-09")):
        with pytest.raises(ValueError, match=f"{name}: makes .* at most {MAX_GRID:,}"):
            BAPOController(**kw)
    assert time.perf_counter() - t < 1.0
    c = BAPOController(high=(1.2, 1.2 + 0.05 * (MAX_GRID - 1)))  # the largest allowed
    assert len(c._highs) == MAX_GRID
