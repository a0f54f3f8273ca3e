"""rliable-style aggregates (#24): IQM, stratified bootstrap, performance profile and probability
of improvement against hand computations, slow loops and rliable itself where installed."""

import itertools
import math

import numpy as np
import pytest

from klppo.report import aggregate as A
from klppo.report.stats import mean_std, summarize


def test_iqm_by_hand():
    # 8 scores: the middle 50% are the 3rd to 6th smallest
    x = np.array([9.0, 1.0, 7.0, 3.0, 100.0, 5.0, -50.0, 6.0])
    assert A.iqm(x) == pytest.approx(np.mean([3.0, 5.0, 6.0, 7.0]))
    # 3 seeds: nothing is trimmed (int(0.25 * 3) == 0), the IQM is the mean
    assert A.iqm([1.0, 2.0, 9.0]) == pytest.approx(4.0)
    # over runs and tasks together: 2 runs x 4 tasks = 8 scores
    assert A.iqm(x.reshape(2, 4)) == pytest.approx(np.mean([3.0, 5.0, 6.0, 7.0]))


def _slow_stratified_ci(x, reps, seed, level=0.95):
    """The stratified bootstrap written as loops: per replicate, per task, draw that task's
    runs with replacement (the same generator calls as the fast path)."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.shape[0], size=(reps, x.shape[0], x.shape[1]))
    values = []
    for r in range(reps):
        sample = [x[idx[r, n, m], m] for n in range(x.shape[0]) for m in range(x.shape[1])]
        values.append(A.iqm(np.array(sample)))
    return tuple(np.percentile(values, [100 * (1 - level) / 2, 100 * (1 + level) / 2]))


def test_stratified_bootstrap_resamples_within_each_task():
    rng = np.random.default_rng(3)
    x = np.stack([rng.normal(0, 1, 5), rng.normal(100, 1, 5)], axis=1)  # 5 runs x 2 tasks
    assert A.bootstrap_ci(x, reps=300, seed=7) == pytest.approx(_slow_stratified_ci(x, 300, 7))
    # each replicate keeps 5 runs of each task: the IQM of a replicate mixes both tasks
    # equally, so every bootstrap IQM lies between the two task means (never a pure task)
    lo, hi = A.bootstrap_ci(x, reps=300, seed=7)
    assert 0 < lo < hi < 100


def test_a_constant_task_has_a_point_interval():
    assert A.bootstrap_ci(np.full(5, 7.0)) == (7.0, 7.0)


def _slow_profile(x, taus):
    return np.array([np.mean([[x[n, m] > t for m in range(x.shape[1])]
                              for n in range(x.shape[0])]) for t in taus])


def test_score_distribution_by_hand_and_its_band():
    x = np.array([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0]])
    taus = [0.0, 1.0, 2.5, 15.0, 100.0]
    assert list(A.score_distribution(x, taus)) == pytest.approx([1.0, 5 / 6, 4 / 6, 2 / 6, 0.0])
    assert A.score_distribution(x, taus) == pytest.approx(_slow_profile(x, taus))
    prof, lo, hi = A.performance_profile(x, taus, reps=500)
    assert np.all(lo <= prof + 1e-12) and np.all(prof <= hi + 1e-12)
    assert lo[0] == hi[0] == 1.0 and lo[-1] == hi[-1] == 0.0


def _slow_improvement(x, y):
    """P(X > Y) + P(X = Y) / 2 over all pairs of runs, averaged over tasks."""
    per_task = []
    for m in range(x.shape[1]):
        pairs = list(itertools.product(x[:, m], y[:, m]))
        per_task.append(sum(1.0 if a > b else 0.5 if a == b else 0.0 for a, b in pairs)
                        / len(pairs))
    return float(np.mean(per_task))


def test_probability_of_improvement_by_hand():
    x = np.array([3.0, 5.0, 7.0])
    y = np.array([1.0, 5.0, 6.0, 8.0])
    # pairs x > y: 3>1; 5>1; 7>1, 7>5, 7>6 -> 5 of 12; one tie (5, 5) counts 1/2
    assert A.probability_of_improvement(x, y) == pytest.approx(5.5 / 12)
    assert A.probability_of_improvement(y, x) == pytest.approx(1 - 5.5 / 12)
    assert A.probability_of_improvement(x, x) == pytest.approx(0.5)
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 4, (6, 3)).astype(float), rng.integers(0, 4, (4, 3)).astype(float)
    assert A.probability_of_improvement(a, b) == pytest.approx(_slow_improvement(a, b))
    lo, hi = A.improvement_ci(a, b, reps=400)
    assert 0 <= lo <= A.probability_of_improvement(a, b) <= hi <= 1


def test_the_same_numbers_as_rliable():
    """rliable's own estimators (rliable.metrics needs numpy and scipy only)."""
    metrics = pytest.importorskip("rliable.metrics")
    rng = np.random.default_rng(1)
    x, y = rng.normal(0, 1, (7, 3)), rng.normal(0.3, 1, (5, 3))
    assert A.iqm(x) == pytest.approx(float(metrics.aggregate_iqm(x)))
    assert A.probability_of_improvement(x, y) == pytest.approx(
        float(metrics.probability_of_improvement(x, y)))
    ties = np.round(x), np.round(y)
    assert A.probability_of_improvement(*ties) == pytest.approx(
        float(metrics.probability_of_improvement(*ties)))


def test_the_intervals_agree_with_rliables_bootstrap():
    """rliable.library (arch's bootstrap) draws other random numbers: the intervals agree
    within the bootstrap's own noise. Needs an arch that imports (pandas < 3)."""
    try:
        from rliable import library as rly
        from rliable import metrics
    except (ImportError, TypeError) as e:  # arch 7.2 with pandas 3.1 fails at import
        pytest.skip(f"rliable.library does not import here: {e}")
    rng = np.random.default_rng(2)
    scores = {"x": rng.normal(0, 1, (10, 2)), "y": rng.normal(1, 1, (10, 2))}
    _, theirs = rly.get_interval_estimates(
        scores, lambda s: np.array([metrics.aggregate_iqm(s)]), reps=20000,
        random_state=np.random.RandomState(0))
    for k, x in scores.items():
        assert A.bootstrap_ci(x, reps=20000) == pytest.approx(tuple(theirs[k][:, 0]), abs=0.05)


def test_returns_at_the_float_limit_are_never_inf_or_nan():
    """A run logs +-inf as +-1e308: the table must not say ``inf ± nan``."""
    for vals in ([1e308, 1e308], [1e308, -1e308, 5.0], [1e308, 1.0]):
        mean, std = mean_std(np.array(vals))
        assert math.isfinite(mean) and math.isfinite(std)
        s = summarize("E", "c", dict(enumerate(vals)))
        assert all(math.isfinite(v) for v in (s.mean, s.std, s.iqm, s.ci_low, s.ci_high))
    assert mean_std(np.array([1e308, 1e308])) == (1e308, 0.0)
    assert mean_std(np.array([1.0, 3.0])) == (2.0, 1.0)


@pytest.mark.parametrize("sizes, words", [
    ([1, 1], "With 1 seed per condition the IQM is that run's return"),
    ([3, 3], "With 3 seeds per condition nothing is trimmed: the IQM is the mean and the "
             "intervals are wide."),
    ([5, 5], "With 5 seeds per condition the IQM leaves out the 1 lowest and highest"),
    ([2, 8], "With 2 to 8 seeds per condition the IQM leaves out the 0 or 2 lowest"),
    ([12], "With 12 seeds per condition the IQM leaves out the 3 lowest and highest returns "
           "of a condition."),
])
def test_the_iqm_note_is_computed_from_the_seed_counts(sizes, words):
    note = A.iqm_note(sizes)
    assert note.startswith(words)
    for n in set(sizes):  # what it says is trimmed is what iqm trims
        k = int(A.TRIM * n)
        x = np.arange(n, dtype=float) ** 3
        assert A.iqm(x) == pytest.approx(np.mean(np.sort(x)[k:n - k]))
