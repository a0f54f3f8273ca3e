"""The controller lab's output a researcher can trust (#24): presets keep their own targets,
open-loop metrics that differ between controllers, a beta axis every controller stays on, and
no earlier replay overwritten without --force."""

import csv

import matplotlib.pyplot as plt
import numpy as np
import pytest

from klppo.cli import main
from klppo.replay.lab import default_controllers, open_loop, parse_controller, response_metrics
from klppo.replay.plots import DECADES, SMOOTH, beta_scale, lab_figure


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_a_named_preset_keeps_its_own_target():
    assert parse_controller("step:preset=rllib", 0.02)[1].target == 0.01
    assert parse_controller("step:preset=klip", 0.05)[1].target == 0.02
    assert parse_controller("step:preset=rllib,target=0.03", 0.02)[1].target == 0.03
    # no preset named: the replay's target, as before
    assert parse_controller("step:hi_band=2", 0.02)[1].target == 0.02
    assert parse_controller("proportional:beta=1", 0.02)[1].target == 0.02
    # the default set is tuned to the replay's target, presets included
    assert {parse_controller(s, 0.05)[1].target for s in default_controllers(0.05)} == {0.05}


def test_the_replay_says_which_target_each_controller_used(tmp_path, capsys):
    (tmp_path / "t.csv").write_text("kl\n" + "\n".join(["0.02", "0.005"] * 10) + "\n")
    assert main(["replay", str(tmp_path / "t.csv"), "--controller", "step:preset=rllib",
                 "proportional:beta=1,horizon=10", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "note: step:preset=rllib keeps its preset's target 0.01; add target=0.02" in out
    rows = {x.split()[0]: x.split()[1] for x in out.splitlines()
            if x.startswith(("step:", "proportional:"))}
    assert rows == {"step:preset=rllib": "0.01", "proportional:beta=1,horizon=10": "0.02"}
    assert "the trace against target 0.01:" in out and "the trace against target 0.02:" in out


def test_response_metrics_by_hand():
    kl = [0.04, 0.04, 0.005, 0.02, 0.005]
    beta = [1.0, 2.0, 4.0, 2.0, 2.0, 1.0]  # before the first update, then after each
    m = response_metrics(kl, beta, 0.02, beta_min=0.5, beta_max=4.0)
    assert m["moves"] == pytest.approx(4 / 5)  # unchanged at the on-target update
    assert m["right_way"] == 1.0  # up when above, down when below
    assert m["reversals"] == pytest.approx(100 * 1 / 5)  # up, up, down, down: one reversal
    assert m["decades"] == pytest.approx(np.log10(4.0))
    assert m["time_at_bounds"] == pytest.approx(1 / 5)  # 4.0 after update 2
    wrong = response_metrics([0.04, 0.04], [1.0, 0.5, 0.25], 0.02, 0.0, 10.0)
    assert wrong["right_way"] == 0.0 and wrong["reversals"] == 0.0
    still = response_metrics([0.04], [1.0, 1.0], 0.02, 0.0, 10.0)
    assert still["moves"] == 0.0 and still["right_way"] is None and still["decades"] == 0.0
    with pytest.raises(ValueError, match="beta before the first update"):
        response_metrics([0.04], [1.0], 0.02, 0.0, 10.0)


def test_open_loop_metrics_differ_between_controllers():
    """The old table gave every controller the trace's tracking error (the same number); the
    response metrics are each controller's own."""
    kl = list(0.02 * np.exp(np.sin(np.arange(60) / 3)))
    specs = default_controllers(0.02)
    ctrls = dict(parse_controller(s, 0.02) for s in specs)
    initial = {k: c.value for k, c in ctrls.items()}
    betas = open_loop(kl, ctrls)
    rows = [response_metrics(kl, [initial[k], *b], ctrls[k].target, ctrls[k].beta_min,
                             ctrls[k].beta_max) for k, b in betas.items()]
    assert len({(r["moves"], r["reversals"], r["decades"]) for r in rows}) == len(specs)


def test_the_beta_axis_keeps_every_controller_in_view():
    # a step rule 20 decades down and a PID beta at 0: log over DECADES, linear below
    collapsed = [[1.0, 1e-20], [2.0, 0.0], [0.5, 1.5]]
    scale, floor = beta_scale(collapsed)
    assert scale == "symlog" and floor == pytest.approx(2.0 * 10.0 ** -DECADES)
    fig = lab_figure([0, 1], {"trace": [0.01, 0.02]},
                     {"step": collapsed[0], "pid": collapsed[1], "x": collapsed[2]}, 0.02, "t")
    beta_ax = fig.axes[1]
    bottom, top = beta_ax.get_ylim()
    assert beta_ax.get_yscale() == "symlog" and bottom == 0 and top >= 2.0
    assert "linear below" in beta_ax.get_ylabel()
    assert beta_scale([[1.0, 0.01]]) == ("log", None)  # all within 4 decades: plain log
    assert beta_scale([[0.0, 0.0]]) == ("linear", None)


def test_targets_that_differ_get_a_line_each():
    # open loop (one observed KL, several controllers): one line per target, named
    fig = lab_figure([0, 1], {"trace": [0.01, 0.02]},
                     {"a": [1.0, 1.0], "b": [1.0, 1.0]}, 0.02, "t",
                     targets={"a": 0.01, "b": 0.02})
    texts = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert [x for x in texts if x.startswith("target")] == ["target 0.01 (a)", "target 0.02 (b)"]


def test_closed_loop_draws_a_row_per_controller_with_its_own_target_and_mean():
    kl = {"a": [0.01, 0.03, 0.02, 0.06], "b": [0.02, 0.02, 0.04, 0.04]}
    fig = lab_figure([0, 1, 2, 3], kl, {"a": [1.0] * 4, "b": [2.0] * 4}, 0.02, "t",
                     targets={"a": 0.01, "b": 0.02})
    assert len(fig.axes) == 4  # (KL, beta) per controller, in the controllers' order
    for row, (label, target) in enumerate([("a", 0.01), ("b", 0.02)]):
        ax, bx = fig.axes[2 * row], fig.axes[2 * row + 1]
        assert ax.get_title(loc="left") == label
        raw, mean, line = ax.get_lines()
        assert list(raw.get_ydata()) == kl[label]
        window = [kl[label][max(0, i - SMOOTH + 1):i + 1] for i in range(4)]
        assert np.allclose(mean.get_ydata(), [sum(w) / len(w) for w in window])
        assert list(line.get_ydata()) == [target, target]
        assert list(bx.get_lines()[0].get_ydata()) == [1.0 + row] * 4


def test_an_earlier_replay_is_refused_without_force(tmp_path, capsys):
    out = tmp_path / "lab"
    assert main(["replay", "--closed-loop", "--steps", "10", "--out", str(out)]) == 0
    first = (out / "replay.csv").read_text()
    capsys.readouterr()
    assert main(["replay", "--closed-loop", "--steps", "12", "--out", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"klppo replay: --out={str(out)!r}: holds an earlier replay (replay.csv, "
                   "replay.png); pass --force to overwrite it, or choose another --out"]
    assert (out / "replay.csv").read_text() == first
    assert main(["replay", "--closed-loop", "--steps", "12", "--out", str(out), "--force"]) == 0
    assert len(list(csv.reader(open(out / "replay.csv")))) == 13
