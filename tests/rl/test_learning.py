"""Learning tests (slow: about 3 minutes on 2 cores). Run with `make test-all` or -m slow."""

import math

import pytest

from klppo.experiments.sweep import DEMO_SPEC, run_sweep
from klppo.report.load import load_runs


@pytest.mark.slow
def test_klip_cartpole_four_way_reaches_450(tmp_path):
    """klip/cartpole, 100k steps, seeds 0-2: the final return (mean of training-episode
    returns over the last 10% of steps) averaged over seeds is >= 450 for clip, per_sample_kl,
    fixed-beta and adaptive-beta kl_penalty."""
    res = run_sweep(DEMO_SPEC, tmp_path / "sweep", workers=2)
    assert not res.failed, [(e.name, e.error) for e in res.failed]
    runs = load_runs([tmp_path / "sweep"]).runs
    by_cond: dict[str, list[float]] = {}
    for r in runs:
        by_cond.setdefault(r.condition, []).append(r.final_return)
    assert set(by_cond) == {"clip", "per_sample_kl", "kl_fixed", "kl_adaptive"}
    for cond, finals in by_cond.items():
        assert len(finals) == 3 and not any(math.isnan(f) for f in finals)
        assert sum(finals) / 3 >= 450, (cond, finals)
    assert by_cond["clip"] == by_cond["per_sample_kl"]  # Theorem 1, end to end
