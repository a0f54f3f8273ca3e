"""The partition table: peak of the seed-mean kill fraction and final |beta_t| quantiles."""

from pathlib import Path

import pytest

from klppo.report.load import Run
from klppo.report.partition import partition_table


def run(seed, kills, q90s, condition="clip"):
    metrics = [{"global_step": 100 * (i + 1), "frac_kill": k, "beta_t_q50": 0.0,
                "beta_t_q90": q, "beta_t_q99": 2 * q} for i, (k, q) in enumerate(zip(kills, q90s))]
    return Run(Path(f"r{seed}"), {"env": "E-v0", "seed": seed}, metrics, condition, "finished")


def test_peak_is_of_the_seed_mean_and_quantiles_are_final_means():
    runs = [run(0, [0.1, 0.5, 0.2, 0.1] + [0.0] * 6, [1.0] * 9 + [3.0]),
            run(1, [0.3, 0.1, 0.2, 0.1] + [0.0] * 6, [1.0] * 9 + [5.0])]
    table = partition_table(runs)
    row = table.splitlines()[2]
    # seed means per step: 0.2, 0.3, 0.2, ...: the peak is 0.3 at step 200 (not seed 0's 0.5)
    assert "| E-v0 | clip | 2 | 0.300 (200) |" in row
    # the last 10% of 1000 steps is the last record: q90 3 and 5 -> 4 ± 1; q99 6 and 10 -> 8 ± 2
    assert row.endswith("| 0 ± 0 | 4 ± 1 | 8 ± 2 |")


def test_runs_without_a_kill_set_are_left_out():
    r = run(0, [0.1] * 10, [1.0] * 10, condition="kl_fixed")
    for m in r.metrics:
        del m["frac_kill"]
    assert len(partition_table([r]).splitlines()) == 2


@pytest.mark.parametrize("n", [1, 3])
def test_one_row_per_env_and_condition(n):
    runs = [run(s, [0.1] * 10, [1.0] * 10) for s in range(n)]
    runs += [run(s, [0.1] * 10, [1.0] * 10, "per_sample_kl") for s in range(n)]
    assert len(partition_table(runs).splitlines()) == 4


def test_kill_set_beta_only_for_the_clip_shape():
    """beta_t_abs_mean / frac_kill is the kill set's mean |beta_t| only where beta_t is 0 off the
    kill set (the clip shape); a catalogue objective's beta_t is not, so no value is derived."""
    from klppo.report.partition import kill_set_beta

    m = {"beta_t_abs_mean": 0.2, "frac_kill": 0.1}
    assert kill_set_beta(m, {"objective": "clip"}) == 0.2 / 0.1
    assert kill_set_beta(m, {"objective": "clip_kl"}) == 0.2 / 0.1
    for objective in ("cispo", "sapo", "sq_log_ratio", "dppo_tv"):
        assert kill_set_beta(m, {"objective": objective}) is None
