"""`klppo report` on a `klppo tune` directory (issue #31): every trial with its parameters,
state and value (the best marked), pruned trials labelled as such, the study's history and the
parameters' importance; read from index.json alone (no Optuna)."""

import json

import matplotlib.pyplot as plt
import numpy as np

from klppo.report import make_report
from klppo.report.tuning import history_figure, read_study, trials_markdown
from tests.report.test_report import fake_run

TRIALS = [  # number, state, value, params
    (0, "complete", 50.0, {"ppo.lr": 0.001, "objective": "clip"}),
    (1, "pruned", 20.0, {"ppo.lr": 0.0001, "objective": "clip"}),
    (2, "complete", 80.0, {"ppo.lr": 0.003, "objective": "per_sample_kl"}),
    (3, "invalid", None, {"ppo.lr": 0.002, "objective": "clip"}),
]


def fake_study(root):
    runs, trials = [], []
    for n, state, value, params in TRIALS:
        name = f"Env-v0__trial{n:04d}__0"
        if value is not None:
            fake_run(root / "runs", name, "Env-v0", params["objective"], 0, [value] * 10)
            label = f"trial{n:04d}" + (" (pruned)" if state == "pruned" else "")
            runs.append({"name": name, "condition": label, "seed": 0, "state": "finished"})
        trials.append({"number": n, "state": state, "value": value, "params": params,
                       "runs": [name] if value is not None else [], "error": None})
    (root / "index.json").write_text(json.dumps({
        "kind": "tune", "runs": runs, "trials": trials, "best_trial": 2,
        "importance": {"ppo.lr": 0.8, "objective": 0.2}}))
    return root


def test_the_trials_table_has_each_trials_parameters_state_and_value(tmp_path):
    study = read_study(fake_study(tmp_path / "t"))
    md = trials_markdown(study)
    assert "| trial | state | value | objective | ppo.lr |" in md
    assert "| 2 (best) | complete | 80.00 | per_sample_kl | 0.003 |" in md
    assert "| 1 | pruned | 20.00 | clip | 0.0001 |" in md
    assert "| 3 | invalid | - | clip | 0.002 |" in md


def test_the_history_shows_each_value_and_the_best_so_far(tmp_path):
    fig = history_figure(read_study(fake_study(tmp_path / "t")))
    ax, imp = fig.axes
    (best,) = [ln for ln in ax.get_lines() if ln.get_label() == "best so far"]
    assert list(best.get_ydata()) == [50.0, 50.0, 80.0, 80.0]  # pruned values never count
    offsets = {c.get_label(): c.get_offsets().tolist() for c in ax.collections}
    assert offsets == {"complete (2)": [[0, 50.0], [2, 80.0]], "pruned (1)": [[1, 20.0]]}
    widths = sorted(p.get_width() for p in imp.patches)
    assert np.allclose(widths, [0.2, 0.8])
    plt.close(fig)


def test_report_of_a_study_has_the_study_section_and_labels_pruned_runs(tmp_path):
    rep = make_report([fake_study(tmp_path / "t")], tmp_path / "out")
    page = rep.html.read_text()
    assert "Tuning study" in page and "<td>per_sample_kl</td>" in page
    assert "1 complete" not in page and "2 complete, 1 invalid, 1 pruned" in page
    assert {s.condition for s in rep.summaries} == {"trial0000", "trial0001 (pruned)",
                                                    "trial0002"}
    assert "| 2 (best) |" in (tmp_path / "out" / "trials.md").read_text()
    assert (tmp_path / "out" / "figures" / "study_0.png").stat().st_size > 5_000


def test_a_sweep_is_not_a_study(tmp_path):
    fake_run(tmp_path / "sw" / "runs", "a", "Env-v0", "clip", 0, [1.0] * 5)
    (tmp_path / "sw" / "index.json").write_text(json.dumps({"runs": [{"name": "a"}]}))
    assert read_study(tmp_path / "sw") is None
    rep = make_report([tmp_path / "sw"], tmp_path / "out")
    assert "Tuning study" not in rep.html.read_text()
    assert not (tmp_path / "out" / "trials.md").exists()
