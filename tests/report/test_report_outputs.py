"""What `klppo report` writes (#24): never over an earlier report without --force, nothing at
all when no run is readable, the kill set's |beta_t| where the all-sample quantiles are 0, and
no ``inf ± nan``."""

import matplotlib.pyplot as plt
import numpy as np
import pytest

from klppo.cli import main
from klppo.report import figures as F
from klppo.report import make_report
from klppo.report.build import NoRunsError
from klppo.report.load import load_runs
from klppo.report.partition import kill_set_beta, partition_table
from tests.report.test_report import fake_run


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_an_earlier_report_is_refused_without_force(tmp_path, capsys):
    fake_run(tmp_path / "runs", "a", "Env-v0", "clip", 0, [1.0, 2.0])
    out = tmp_path / "out"
    assert main(["report", str(tmp_path / "runs"), "--out", str(out)]) == 0
    stale = out / "figures" / "Old-v0__curves.png"
    stale.write_bytes(b"old")
    before = (out / "report.html").read_text()
    capsys.readouterr()
    assert main(["report", str(tmp_path / "runs"), "--out", str(out)]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.splitlines() == [
        f"klppo report: --out={str(out)!r}: holds an earlier report (report.html, "
        "final_returns.md, final_returns.csv, equivalence.md, equivalence.csv, aggregates.md, "
        "figures); pass --force to replace it, or choose another --out"]
    assert (out / "report.html").read_text() == before and stale.exists()
    assert main(["report", str(tmp_path / "runs"), "--out", str(out), "--force"]) == 0
    assert not stale.exists()  # the earlier report's figures go with it


def test_a_directory_without_a_report_is_used(tmp_path):
    fake_run(tmp_path / "runs", "a", "Env-v0", "clip", 0, [1.0, 2.0])
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"


def test_no_readable_run_writes_nothing(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    out = tmp_path / "out"
    assert main(["report", str(tmp_path / "empty"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"klppo report: no readable run found in "
                                               f"{tmp_path / 'empty'}; 1 skipped")
    assert not out.exists()
    with pytest.raises(NoRunsError):
        make_report([tmp_path / "empty"], out)
    assert not out.exists()
    assert main(["snapshot", str(tmp_path / "empty"), str(tmp_path / "snap")]) == 2
    assert not (tmp_path / "snap").exists()


KILL = {"frac_kill": 0.05, "beta_t_abs_mean": 0.04, "beta_t_q50": 0.0, "beta_t_q90": 0.0,
        "beta_t_q99": 1.2}


def test_the_kill_set_mean_is_the_all_sample_mean_over_the_kill_fraction():
    assert kill_set_beta(KILL, {}) == pytest.approx(0.8)  # 0.04 / 0.05
    assert kill_set_beta({**KILL, "frac_kill": 0.0}, {}) is None  # no kill set
    assert kill_set_beta({"frac_kill": 0.05}, {}) is None  # not logged
    # a soft shape's beta_t is not 0 off the kill set: no such identity
    assert kill_set_beta(KILL, {"ppo": {"shape": "sigmoid"}}) is None


def test_the_partition_figure_shows_the_kill_set_not_zero_quantiles(tmp_path):
    """With 5% of the samples killed, the all-sample q50 and q90 of |beta_t| are 0 at every
    iteration (the bug: two flat lines at 0); the panel draws the kill-set mean instead."""
    for seed in (0, 1):
        fake_run(tmp_path, f"c{seed}", "Env-v0", "clip", seed, [1.0] * 10,
                 extra={**KILL, "beta_t_abs_mean": 0.04 * (1 + seed)})
    runs = load_runs([tmp_path]).runs
    fig = F.partitions("Env-v0", "clip", runs)
    beta_ax = fig.axes[2]
    lines = {x.get_label(): x.get_ydata() for x in beta_ax.get_lines()}
    assert sorted(lines) == ["mean on the kill set", "q99 over all samples"]
    assert np.allclose(lines["mean on the kill set"], (0.8 + 1.6) / 2)
    assert np.all(lines["mean on the kill set"] > 0)
    assert "q50 and q90 over all samples: 0 throughout" in \
        beta_ax.get_legend().get_title().get_text()
    row = partition_table(runs).splitlines()[2]
    assert "| 1.2 ± 0.4 | 0 ± 0 | 0 ± 0 | 1.2 ± 0 |" in row  # kill-set mean 0.8 and 1.6


def test_quantiles_above_zero_are_still_drawn(tmp_path):
    fake_run(tmp_path, "c", "Env-v0", "clip", 0, [1.0] * 5,
             extra={**KILL, "frac_kill": 0.6, "beta_t_q50": 0.3, "beta_t_q90": 0.9})
    fig = F.partitions("Env-v0", "clip", load_runs([tmp_path]).runs)
    labels = [x.get_label() for x in fig.axes[2].get_lines()]
    assert labels == ["mean on the kill set", "q50 over all samples", "q90 over all samples",
                      "q99 over all samples"]
    assert "throughout" not in fig.axes[2].get_legend().get_title().get_text()


def test_returns_at_the_float_limit_print_no_inf_or_nan(tmp_path, capsys):
    for seed in (0, 1):
        fake_run(tmp_path / "runs", f"c{seed}", "Env-v0", "clip", seed, [1e308] * 5)
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out + (tmp_path / "out" / "report.html").read_text()
    assert "inf" not in out.replace("info", "") and "nan" not in out
    assert "| Env-v0 | clip | 2 | 100000000" in out  # 1e308 ± 0, written out by :.1f


def test_identical_partitions_are_drawn_once_naming_both(tmp_path):
    """clip and per_sample_kl log the same partition seed for seed (Theorem 1): one figure
    named for both; a condition whose partition differs keeps its own."""
    import yaml

    for seed in (0, 1):
        for objective in ("clip", "per_sample_kl"):
            fake_run(tmp_path / "runs", f"{objective}{seed}", "Env-v0", objective, seed,
                     [1.0] * 4, extra=KILL)
        other = fake_run(tmp_path / "runs", f"spo{seed}", "Env-v0", "per_sample_kl", seed,
                         [1.0] * 4, extra={**KILL, "frac_kill": 0.2})
        cfg = yaml.safe_load((other / "config.yaml").read_text())
        cfg["ppo"]["shape"] = "spo"
        (other / "config.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "out"
    assert main(["report", str(tmp_path / "runs"), "--out", str(out)]) == 0
    names = sorted(p.name for p in (out / "figures").glob("*partition*.png"))
    assert names == ["Env-v0__clip__partition.png", "Env-v0__per_sample_kl[spo]__partition.png"]
    page = (out / "report.html").read_text()
    assert "clip = per_sample_kl" in page and "are identical, seed for seed" in page
