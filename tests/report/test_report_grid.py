"""Reports of sweeps with a grid axis (#24): the equivalence table keyed by every axis, curves
faceted by grid point with identical curves visible, aggregates per condition."""

import csv
import json

import matplotlib.pyplot as plt
import numpy as np
import pytest
import yaml

from klppo.report import make_report
from klppo.report.curves import IDENTICAL_STYLE, auto_smooth, learning_curves
from klppo.report.grid import assign_axes, base_condition
from klppo.report.load import load_runs
from tests.report.test_report import fake_run


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")

LRS = [0.0003, 0.001, 0.003]


def _set(run, **fields):
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    for dotted, v in fields.items():
        node = cfg
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    return run


def _returns(objective, lr, seed, n=10):
    """clip and per_sample_kl give the same curve (Theorem 1); lr and seed change it."""
    return [float(i * (1 + 1000 * lr) + seed) for i in range(n)]


def fake_sweep(root, objectives=("clip", "per_sample_kl"), lrs=LRS, seeds=(0, 1, 2),
               returns=_returns):
    """A sweep directory as `klppo sweep --grid ppo.lr=...` writes it (spec, index, runs)."""
    entries = []
    for obj in objectives:
        for lr in lrs:
            for seed in seeds:
                cond = f"{obj}__lr={lr}"
                name = f"Env-v0__{cond}__{seed}"
                run = fake_run(root / "runs", name, "Env-v0", obj, seed,
                               returns(obj, lr, seed))
                _set(run, ppo__lr=lr)
                entries.append({"name": name, "condition": cond, "seed": seed})
    (root / "index.json").write_text(json.dumps({"runs": entries}))
    (root / "spec.yaml").write_text(yaml.safe_dump({
        "preset": "x", "conditions": {o: {"objective": o} for o in objectives},
        "grid": {"ppo.lr": list(lrs)}, "seeds": list(seeds)}))
    return root


def test_equivalence_has_a_row_per_grid_point_and_seed_with_the_axis_column(tmp_path):
    """README's sweep shape: 2 conditions x 3 learning rates x 3 seeds -> 9 pairs, keyed by
    ppo.lr (the old key, env and seed, kept 3 and dropped the rest silently)."""
    sweep = fake_sweep(tmp_path / "sw")
    rep = make_report([sweep], tmp_path / "out")
    assert len(rep.equivalences) == 9
    assert {(e.settings["ppo.lr"], e.seed) for e in rep.equivalences} == {
        (lr, s) for lr in LRS for s in (0, 1, 2)}
    assert all(e.max_abs_diff == 0 for e in rep.equivalences)
    rows = list(csv.DictReader(open(tmp_path / "out" / "equivalence.csv")))
    assert list(rows[0]) == ["env", "seed", "ppo.lr", "iterations", "max_abs_diff"]
    assert len(rows) == 9
    md = (tmp_path / "out" / "equivalence.md").read_text().splitlines()
    assert md[0] == "| env | seed | ppo.lr | iterations | max abs diff of return curves |"
    assert "| Env-v0 | 2 | 0.003 | 10 | 0 |" in md
    assert "<th>ppo.lr</th>" in rep.html.read_text()


def test_two_learning_rates_give_six_rows(tmp_path):
    sweep = fake_sweep(tmp_path / "sw", lrs=[0.0003, 0.001])
    rep = make_report([sweep], tmp_path / "out")
    assert len(rep.equivalences) == 6
    assert sorted({e.settings["ppo.lr"] for e in rep.equivalences}) == [0.0003, 0.001]


def test_runs_given_on_their_own_are_keyed_by_what_differs(tmp_path):
    """No sweep: runs of one objective and seed that differ in ppo.lr are apart in every table
    (the condition label gains __lr=...), and pair with the per_sample_kl run at their lr."""
    for obj in ("clip", "per_sample_kl"):
        for lr in (0.001, 0.003):
            _set(fake_run(tmp_path / "runs", f"{obj}{lr}", "Env-v0", obj, 0,
                          _returns(obj, lr, 0)), ppo__lr=lr)
    rep = make_report([tmp_path / "runs"], tmp_path / "out")
    assert sorted(s.condition for s in rep.summaries) == [
        "clip__lr=0.001", "clip__lr=0.003", "per_sample_kl__lr=0.001", "per_sample_kl__lr=0.003"]
    assert sorted(e.settings["ppo.lr"] for e in rep.equivalences) == [0.001, 0.003]
    assert not any("second run" in n for n in rep.notes)


def test_a_run_without_a_partner_is_named_not_dropped(tmp_path):
    fake_run(tmp_path / "runs", "c0", "Env-v0", "clip", 0, [1.0, 2.0])
    fake_run(tmp_path / "runs", "p0", "Env-v0", "per_sample_kl", 0, [1.0, 2.0])
    lonely = _set(fake_run(tmp_path / "runs", "c1", "Env-v0", "clip", 1, [1.0, 2.0]),
                  ppo__eps=0.1)
    rep = make_report([tmp_path / "runs"], tmp_path / "out")
    assert [e.seed for e in rep.equivalences] == [0]
    assert any(n.startswith(f"{lonely}: a clip run with no per_sample_kl run of the same seed "
                            "and settings") for n in rep.notes)


def test_base_condition_and_axes_of_a_sweep(tmp_path):
    runs = assign_axes(load_runs([fake_sweep(tmp_path / "sw")]).runs)
    assert {r.axes for r in runs} == {("ppo.lr",)}
    assert {base_condition(r) for r in runs} == {"clip", "per_sample_kl"}


def _legend_texts(fig):
    legends = [lg for lg in fig.legends] + [a.get_legend() for a in fig.axes if a.get_legend()]
    return [t.get_text() for lg in legends for t in lg.get_texts()]


def test_curves_are_faceted_by_grid_point_and_identical_curves_say_so(tmp_path):
    runs = assign_axes(load_runs([fake_sweep(tmp_path / "sw")]).runs)
    fig = learning_curves("Env-v0", runs, smooth=1)
    panels = [a for a in fig.axes if a.get_visible()]
    assert [a.get_title() for a in panels] == [f"ppo.lr={lr}" for lr in LRS]
    texts = _legend_texts(fig)
    assert texts == ["clip (n=3)", "per_sample_kl (n=3), identical to clip"]
    for ax in panels:  # clip wide and solid under per_sample_kl, dashed with markers
        clip, psk = ax.get_lines()
        assert clip.get_linewidth() > psk.get_linewidth()
        assert psk.get_linestyle() == "--" and psk.get_marker() == IDENTICAL_STYLE["marker"]
        assert np.array_equal(clip.get_ydata(), psk.get_ydata(), equal_nan=True)
        assert clip.get_color() != psk.get_color()


def test_curves_that_differ_are_not_called_identical(tmp_path):
    def returns(obj, lr, seed):
        return _returns(obj, lr, seed) if obj == "clip" or lr != 0.001 else [0.0] * 10

    runs = assign_axes(load_runs([fake_sweep(tmp_path / "sw", returns=returns)]).runs)
    texts = _legend_texts(learning_curves("Env-v0", runs))
    assert texts == ["clip (n=3)", "per_sample_kl (n=3), identical to clip at ppo.lr=0.0003; "
                     "ppo.lr=0.003"]
    one = assign_axes(load_runs([fake_sweep(tmp_path / "one", lrs=[0.001],
                                            returns=returns)]).runs)
    assert "identical" not in " ".join(_legend_texts(learning_curves("Env-v0", one)))


def test_smoothing_is_on_by_default_and_stated(tmp_path):
    runs = load_runs([fake_sweep(tmp_path / "sw", lrs=[0.001])]).runs
    assert auto_smooth(runs) == 1  # 10 iterations: raw
    long = fake_run(tmp_path / "long", "r", "Env-v0", "clip", 0, [float(i) for i in range(100)])
    assert auto_smooth(load_runs([long]).runs) == 5  # 5% of 100 iterations
    rep = make_report([long], tmp_path / "out")
    (caption, _), *_ = rep.figures
    assert "trailing moving average over 5 iterations" in caption
    assert "moving averages over 5 iterations" in rep.html.read_text()
    rep = make_report([long], tmp_path / "raw", smooth=1)
    assert "raw, not smoothed" in rep.figures[0][0]


def test_the_aggregates_compare_every_condition(tmp_path):
    rep = make_report([fake_sweep(tmp_path / "sw", lrs=[0.001, 0.003])], tmp_path / "out")
    (c,) = rep.comparisons
    assert sorted(c.scores) == sorted(f"{o}__lr={lr}" for o in ("clip", "per_sample_kl")
                                      for lr in (0.001, 0.003))
    assert c.identical == {"per_sample_kl__lr=0.001": "clip__lr=0.001",
                           "per_sample_kl__lr=0.003": "clip__lr=0.003"}
    # lr 0.003 gives higher returns for every seed: P(0.003 > 0.001) = 1
    assert c.improvement[("clip__lr=0.003", "clip__lr=0.001")][0] == 1.0
    assert c.improvement[("clip__lr=0.001", "per_sample_kl__lr=0.001")][0] == 0.5
    md = (tmp_path / "out" / "aggregates.md").read_text()
    # tables and figures show a grid condition as "clip, lr=0.003"; the CSV keeps the name
    assert "| clip, lr=0.003 | 3 |" in md and "P(row > column)" in md and "__" not in md
    assert "__lr" not in (tmp_path / "out" / "final_returns.md").read_text()
    assert "clip__lr=0.003" in (tmp_path / "out" / "final_returns.csv").read_text()
    assert not any("__lr" in cap for cap, _ in rep.figures)
    assert "clip,<wbr> lr=0.003" in rep.html.read_text()
    assert any("IQM" in cap for cap, _ in rep.figures)
    assert "With 3 seeds per condition nothing is trimmed" in rep.html.read_text()
    # the sentence follows the data: one seed fewer of one condition
    one = load_runs([fake_sweep(tmp_path / "sw2", lrs=[0.001])]).runs
    less = make_report([r.path for r in one if not (r.seed == 2 and "clip" in r.condition)],
                       tmp_path / "out2")
    assert "With 2 to 3 seeds per condition nothing" in less.html.read_text()


@pytest.mark.parametrize("n", [1, 2])
def test_one_condition_has_no_comparison(tmp_path, n):
    for seed in range(n):
        fake_run(tmp_path / "runs", f"c{seed}", "Env-v0", "clip", seed, [1.0, 2.0])
    rep = make_report([tmp_path / "runs"], tmp_path / "out")
    assert rep.comparisons == [] and "Aggregates over seeds" not in rep.html.read_text()
