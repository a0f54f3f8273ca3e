"""The report's figures: KL vs target per condition, the anneal note, partitions, smoothing."""

import json
import math

import numpy as np
import pytest
import yaml
from matplotlib.colors import to_rgba

from klppo.cli import main
from klppo.report import figures as F
from klppo.report import make_report
from klppo.report.load import load_runs
from tests.report.test_report import fake_run


def _kl_runs(root, cond, controller, seeds, target=0.02, lr=None, anneal=True):
    for seed in seeds:
        # a fixed beta has no target, even where a kl_target is logged (kl.target in the config)
        extra = {"kl_observed": 0.01 * (1 + seed), "kl_target": target, "beta": 0.5 + seed}
        d = fake_run(root, f"{cond}{seed}", "Env-v0", "kl_penalty", seed, [1.0] * 10,
                     extra=extra, kl={"controller": controller, "beta": 1.0})
        if lr is not None:
            lines = (d / "metrics.jsonl").read_text().splitlines()
            recs = [json.loads(x) | {"lr": lr(i, len(lines))} for i, x in enumerate(lines)]
            (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        cfg = yaml.safe_load((d / "config.yaml").read_text())
        cfg["ppo"]["anneal_lr"] = anneal
        (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    return load_runs([root]).runs


def _legend_is_outside(fig, ax) -> bool:
    fig.canvas.draw()
    legend = ax.get_legend().get_window_extent()
    return legend.x0 >= ax.get_window_extent().x1


def test_one_kl_panel_per_condition_with_seeds_overlaid_and_the_target_apart(tmp_path):
    runs = _kl_runs(tmp_path / "a", "ad", "step", [0, 1, 2])
    fig = F.kl_tracking("Env-v0", "kl_adaptive", runs)
    kl_ax = fig.axes[0]
    labels = [line.get_label() for line in kl_ax.get_lines()]
    assert labels == ["seed 0", "seed 1", "seed 2", "target 0.02"]
    target = kl_ax.get_lines()[-1]
    seed_colours = {to_rgba(line.get_color()) for line in kl_ax.get_lines()[:-1]}
    assert len(seed_colours) == 3 and to_rgba(target.get_color()) not in seed_colours
    assert "KL vs target" in kl_ax.get_title()
    assert _legend_is_outside(fig, kl_ax)


def test_fixed_beta_panel_has_no_target(tmp_path):
    runs = _kl_runs(tmp_path / "f", "fx", "fixed", [0, 1])
    fig = F.kl_tracking("Env-v0", "kl_fixed", runs)
    kl_ax = fig.axes[0]
    assert "target" not in kl_ax.get_title() and "fixed beta 1" in kl_ax.get_title()
    assert [line.get_label() for line in kl_ax.get_lines()] == ["seed 0", "seed 1"]


def test_report_has_one_kl_figure_per_condition(tmp_path):
    _kl_runs(tmp_path / "runs", "ad", "step", [0, 1, 2])
    _kl_runs(tmp_path / "runs", "fx", "fixed", [0, 1])
    rep = make_report([tmp_path / "runs"], tmp_path / "out")
    kl = [c for c, _ in rep.figures if "KL" in c]
    assert len(kl) == 2
    assert any("KL vs target and beta, seeds 0, 1, 2" in c for c in kl)
    assert any("fixed beta: no target" in c and "seeds 0, 1." in c for c in kl)


def test_anneal_note_only_when_the_learning_rate_falls_to_zero(tmp_path):
    anneal = _kl_runs(tmp_path / "a", "a", "step", [0], lr=lambda i, n: 3e-4 * (1 - i / n))
    flat = _kl_runs(tmp_path / "b", "b", "step", [0], lr=lambda i, n: 3e-4, anneal=False)
    assert F.lr_anneals(anneal) and not F.lr_anneals(flat)
    rep = make_report([tmp_path / "a"], tmp_path / "oa")
    assert any(F.ANNEAL_NOTE in c for c, _ in rep.figures)
    assert F.ANNEAL_NOTE in rep.html.read_text()
    rep = make_report([tmp_path / "b"], tmp_path / "ob")
    assert not any(F.ANNEAL_NOTE in c for c, _ in rep.figures)


def test_kill_and_pass_have_their_own_scale(tmp_path):
    for seed in (0, 1):
        fake_run(tmp_path, f"c{seed}", "Env-v0", "clip", seed, [1.0] * 10,
                 extra={"frac_kill": 0.004, "frac_pass": 0.01, "frac_in": 0.986})
    runs = load_runs([tmp_path]).runs
    fig = F.partitions("Env-v0", "clip", runs)
    kill_ax = next(a for a in fig.axes if "kill" in [x.get_label() for x in a.get_lines()])
    assert {x.get_label() for x in kill_ax.get_lines()} == {"kill", "pass"}  # no "in" here
    bottom, top = kill_ax.get_ylim()
    assert bottom == 0 and top < 0.05  # 0.004 and 0.01 fill the axis, not 1% of it


def test_smooth_values_by_hand():
    v = F.smooth_values([1.0, None, 3.0, 5.0, 7.0], 2)
    assert np.allclose(v, [1.0, 1.0, 3.0, 4.0, 6.0])
    assert np.allclose(F.smooth_values([1.0, 2.0], 1), [1.0, 2.0])
    assert math.isnan(F.smooth_values([None, None, 1.0], 2)[1])


def test_report_smooth_flag(tmp_path, capsys):
    runs = _kl_runs(tmp_path / "r", "ad", "step", [0])
    fig = F.kl_tracking("Env-v0", "ad", runs, smooth=3)
    raw = [m["kl_observed"] for m in runs[0].metrics]
    assert np.allclose(fig.axes[0].get_lines()[0].get_ydata(), F.smooth_values(raw, 3))
    assert "moving average over 3 iterations" in fig.axes[0].get_title()
    assert main(["report", str(tmp_path / "r"), "--out", str(tmp_path / "o"),
                 "--smooth", "3"]) == 0
    assert "moving averages over 3 iterations" in (tmp_path / "o" / "report.html").read_text()
    capsys.readouterr()
    assert main(["report", str(tmp_path / "r"), "--out", str(tmp_path / "p"),
                 "--smooth", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--smooth=0" in err and not (tmp_path / "p").exists()
    assert main(["report", str(tmp_path / "r"), "--out", str(tmp_path / "p"),
                 "--smooth", str(10**12)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "in [1, 100,000]" in err and not (tmp_path / "p").exists()
    with pytest.raises(ValueError, match="smooth=0"):
        make_report([tmp_path / "r"], tmp_path / "q", smooth=0)


def test_a_beta_of_0_on_the_log_panel_is_said_not_silently_dropped(tmp_path):
    runs = _kl_runs(tmp_path / "p", "pid", "pid", [0])
    recs = runs[0].metrics
    for i, m in enumerate(recs):
        m["beta"] = 0.0 if i % 2 else 0.5  # PID: beta 0 on every other iteration
    fig = F.kl_tracking("Env-v0", "pid", runs)
    texts = [t.get_text() for t in fig.axes[1].texts]
    assert texts == ["5 of 10 values <= 0: gaps on this log scale"]
    assert fig.axes[1].get_yscale() == "log"
    assert not fig.axes[0].texts  # every KL is > 0: nothing to say
