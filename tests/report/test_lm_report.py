"""The RLHF comparison report's figures: the legend never covers a curve (#24)."""

import json

import yaml

from klppo.report.lm import lm_report


def _arm(root, name, kls, target=6.0):
    d = root / "runs" / name
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump({"kind": "rlhf", "controller": "fixed"}))
    with open(d / "metrics.jsonl", "w") as f:
        for i, k in enumerate(kls):
            rec = {"iteration": i + 1, "episodes": 32 * (i + 1), "kl": k, "score": 0.1 * i,
                   "beta": 0.1, "beta_after": 0.1, "kl_target": target,
                   "kl_unit": "nats per sequence", "distinct_2": 0.5,
                   "held_out_perplexity": 60.0 + i}
            f.write(json.dumps(rec) + "\n")


def test_every_legend_is_outside_its_axes(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from klppo.report import lm

    figs = []
    real = lm._curves

    def keep(*a, **k):
        figs.append(real(*a, **k))
        return figs[-1]

    monkeypatch.setattr(lm, "_curves", keep)
    monkeypatch.setattr(plt, "close", lambda fig=None: None)  # keep them to measure
    # KL curves that sit on the target at the top right, where a default legend goes
    _arm(tmp_path, "fixed-2.0__0", [1.0, 3.0, 5.5, 6.0, 6.2, 6.0])
    _arm(tmp_path, "adaptive__0", [2.0, 4.0, 6.5, 6.1, 5.9, 6.0])
    page, summaries = lm_report(tmp_path, tmp_path / "out")
    assert page.exists() and [s.arm for s in summaries] == ["adaptive", "fixed-2.0"]
    assert len(figs) == 4
    for fig in figs:
        fig.canvas.draw()
        (ax,) = fig.axes
        legend = ax.get_legend().get_window_extent()
        assert legend.x0 >= ax.get_window_extent().x1, ax.get_title()
    kl = next(f for f in figs if "KL" in f.axes[0].get_title())
    assert "target 6" in [t.get_text() for t in kl.axes[0].get_legend().get_texts()]


def test_a_stopped_comparison_is_reported_over_the_iterations_every_run_reached(tmp_path):
    # a comparison stopped by a signal: its runs end at different iterations (seen on a GPU,
    # 39 to 42 of 80); the report covers iterations 1..4 of every run, and says so
    _arm(tmp_path, "fixed__0", [1.0, 2.0, 3.0, 4.0, 100.0])
    _arm(tmp_path, "fixed__1", [3.0, 4.0, 5.0, 6.0])
    _arm(tmp_path, "adaptive__0", [2.0, 2.0, 8.0, 8.0, 100.0, 100.0])
    page, summaries = lm_report(tmp_path, tmp_path / "out")
    by = {s.arm: s for s in summaries}
    assert by["fixed"].kl_second_half == (3.5 + 5.5) / 2  # iterations 3-4 of each seed
    assert by["adaptive"].kl_second_half == 8.0
    assert by["adaptive"].final_perplexity == 63.0  # iteration 4's, not 6's
    note = "every run is read up to iteration 4"
    assert note in (tmp_path / "out" / "summary.md").read_text() and note in page.read_text()


def test_runs_of_equal_length_are_not_cut(tmp_path):
    _arm(tmp_path, "fixed__0", [1.0, 2.0, 3.0, 4.0])
    _arm(tmp_path, "adaptive__0", [2.0, 2.0, 8.0, 9.0])
    _, summaries = lm_report(tmp_path, tmp_path / "out")
    assert {s.arm: s.kl_second_half for s in summaries} == {"adaptive": 8.5, "fixed": 3.5}
    assert "stopped" not in (tmp_path / "out" / "summary.md").read_text()


def test_the_table_is_recomputed_from_curves_csv_alone(tmp_path):
    # a snapshot carries curves.csv, so every number of summary.md can be checked from it
    import csv

    import numpy as np

    _arm(tmp_path, "fixed__0", [1.0, 2.0, 3.0, 4.0, 100.0])
    _arm(tmp_path, "fixed__1", [3.0, 4.0, 5.0, 6.0])
    _arm(tmp_path, "adaptive__0", [2.0, 7.0, 8.0, 5.0])
    _, summaries = lm_report(tmp_path, tmp_path / "out")
    with open(tmp_path / "out" / "curves.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["run"] for r in rows} == {"fixed__0", "fixed__1", "adaptive__0"}
    assert len(rows) == 12  # the common cut: 4 iterations of each run
    for s in summaries:
        runs = {}
        for r in rows:
            if r["arm"] == s.arm:
                runs.setdefault(r["run"], []).append(r)
        half = [[float(r["kl"]) for r in rs[len(rs) // 2:]] for rs in runs.values()]
        errs = [abs(np.mean(h) - float(rs[0]["kl_target"])) for h, rs in
                zip(half, runs.values())]
        assert s.kl_second_half == np.mean([np.mean(h) for h in half])
        assert s.kl_abs_error_second_half == np.mean(errs)
        assert s.max_seed_abs_error == max(errs)
        assert s.final_perplexity == np.mean([float(rs[-1]["held_out_perplexity"])
                                              for rs in runs.values()])


def test_the_report_names_the_machines_the_runs_recorded(tmp_path):
    _arm(tmp_path, "fixed__0", [1.0, 2.0])
    _arm(tmp_path, "adaptive__0", [1.0, 2.0])
    meta = {"machine": {"cpu": "Test CPU 9000", "cpu_count": 2, "gpu": None},
            "platform": "Linux-x86_64", "python": "3.12.0", "packages": {"torch": "2.13.0"}}
    for run in ("fixed__0", "adaptive__0"):
        (tmp_path / "runs" / run / "metadata.json").write_text(json.dumps(meta))
    page, _ = lm_report(tmp_path, tmp_path / "out")
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "Measured on" in md and md.count("Test CPU 9000 CPU (2 logical cores)") == 1
    assert "differ across machines" in md
    assert "Test CPU 9000" in page.read_text()
