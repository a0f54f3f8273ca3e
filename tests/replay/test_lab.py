import csv
import json
import math

import pytest

from klppo.cli import main
from klppo.core.controllers import make_controller
from klppo.replay.lab import (
    Plant,
    closed_loop,
    load_trace,
    open_loop,
    parse_controller,
    tracking_metrics,
)


def test_open_loop_is_the_controllers_own_trajectory(tmp_path):
    trace = [0.05, 0.001, 0.02, 0.04, 0.0]
    got = open_loop(trace, {"s": make_controller("step", preset="rllib")})
    ref = make_controller("step", preset="rllib")
    assert got["s"] == [ref.update(d) for d in trace]
    label, c = parse_controller("proportional:beta=1,horizon=4", target=0.02)
    assert label == "proportional:beta=1,horizon=4" and c.target == 0.02 and c.horizon == 4


def test_load_trace_from_metrics_and_csv(tmp_path):
    with open(tmp_path / "metrics.jsonl", "w") as f:
        for i, kl in enumerate([0.01, 0.03]):
            f.write(json.dumps({"global_step": 512 * (i + 1), "kl_rollout": kl,
                                "kl_observed": kl * 2, "kl_target": 0.02}) + "\n")
        f.write('{"global_step": 1536, "kl_obs')
    steps, kl, target = load_trace(tmp_path)
    assert (steps, kl, target) == ([512.0, 1024.0], [0.02, 0.06], 0.02)
    assert load_trace(tmp_path, "kl_rollout")[1] == [0.01, 0.03]
    (tmp_path / "t.csv").write_text("step,kl\n0,0.1\n5,0.2\n")
    assert load_trace(tmp_path / "t.csv")[:2] == ([0.0, 5.0], [0.1, 0.2])
    with pytest.raises(ValueError, match="no column 'x'"):
        load_trace(tmp_path / "t.csv", "x")


def test_plant_without_noise_has_the_stated_response_and_proportional_converges():
    plant = Plant(scale=0.02, power=2.0, beta_floor=0.1, drift=0.0, noise=0.0)
    fixed = closed_loop("fixed", make_controller("fixed", beta=0.4, target=0.02), plant, 10)
    assert fixed.kl == pytest.approx([0.02 / 0.5**2] * 10)
    beta_star = math.sqrt(0.02 / 0.02) - 0.1  # KL(beta*) = target
    prop = closed_loop("p", make_controller("proportional", beta=0.3, target=0.02, horizon=2),
                       plant, 400)
    assert prop.beta[-1] == pytest.approx(beta_star, rel=0.01)
    assert prop.metrics["tracking_error"] < 0.01 and prop.metrics["settling_time"] is not None
    a = closed_loop("a", make_controller("step", target=0.02), Plant(seed=3), 50)
    b = closed_loop("b", make_controller("step", target=0.02), Plant(seed=3), 50)
    assert a.kl == b.kl and a.beta == b.beta


def test_tracking_metrics_by_hand():
    kl = [0.04, 0.01, 0.02, 0.02, 0.04, 0.02]
    beta = [1.0, 0.5, 0.5, 10.0, 10.0, 1.0]
    m = tracking_metrics(kl, beta, 0.02, beta_min=0.5, beta_max=10.0, band=0.5, window=1)
    # second half: 0.02, 0.04, 0.02 -> |log| = 0, log 2, 0
    assert m["tracking_error"] == pytest.approx(math.log(2) / 3)
    # first within the band at index 2 (0.02); afterwards the worst excess is 0.04 -> +1
    assert m["overshoot"] == pytest.approx(1.0)
    # the last out-of-band step is index 4: settled from index 5
    assert m["settling_time"] == 5.0
    assert m["time_at_bounds"] == pytest.approx(4 / 6)


def test_replay_cli_open_and_closed_loop(tmp_path, capsys):
    (tmp_path / "t.csv").write_text("kl\n" + "\n".join(str(0.01 * (1 + i % 3)) for i in
                                                        range(30)) + "\n")
    assert main(["replay", str(tmp_path / "t.csv"), "--target", "0.02",
                 "--controller", "step:preset=rllib", "fixed:beta=2", "--out",
                 str(tmp_path / "o")]) == 0
    rows = list(csv.DictReader(open(tmp_path / "o" / "replay.csv")))
    assert len(rows) == 30 and "beta[step:preset=rllib]" in rows[0]
    assert (tmp_path / "o" / "replay.png").stat().st_size > 1000
    assert main(["replay", "--closed-loop", "--steps", "40", "--out", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "tracking_error" in out and "pid" in out and "proportional" in out
    assert main(["replay", str(tmp_path / "nope.csv"), "--out", str(tmp_path / "x")]) == 2


def test_replay_writes_where_asked_and_nowhere_else(tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    out = tmp_path / "elsewhere" / "lab"
    assert main(["replay", "--closed-loop", "--steps", "20", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["replay.csv", "replay.png"]
    assert list(cwd.iterdir()) == []


def test_lab_figure_has_a_beta_legend_and_says_what_x_counts():
    from klppo.replay.plots import lab_figure

    steps = [0, 1, 2]
    betas = {"fixed:beta=1": [1.0, 1.0, 1.0], "step:preset=rllib": [1.0, 1.5, 2.25]}
    fig = lab_figure(steps, {"trace": [0.01, 0.02, 0.03]}, betas, 0.02, "t",
                     xlabel="environment steps (the run's global_step)")
    kl_ax, beta_ax = fig.axes
    assert [t.get_text() for t in beta_ax.get_legend().get_texts()] == list(betas)
    assert beta_ax.get_xlabel() == "environment steps (the run's global_step)"
    assert "target 0.02" in [t.get_text() for t in kl_ax.get_legend().get_texts()]


def test_trace_x_label_names_the_steps_load_trace_returns(tmp_path):
    from klppo.replay.lab import trace_x_label

    (tmp_path / "metrics.jsonl").write_text('{"global_step": 512, "kl_rollout": 0.01}\n')
    (tmp_path / "a.csv").write_text("step,kl\n10,0.01\n")
    (tmp_path / "b.csv").write_text("kl\n0.01\n")
    assert "global_step" in trace_x_label(tmp_path)
    assert "global_step" in trace_x_label(tmp_path / "metrics.jsonl")
    assert trace_x_label(tmp_path / "a.csv") == "step (the CSV's step column)"
    assert trace_x_label(tmp_path / "b.csv") == "row of the CSV file"
