"""`klppo tune`: an Optuna study of CartPole trials with a tiny budget: each trial an ordinary
run directory scored by the final-return protocol, pruning, resuming a stopped study, and bad
specs refused in one line before any directory is made."""

import json
import signal
from pathlib import Path

import pytest
import yaml

pytest.importorskip("optuna")

from klppo.cli import main  # noqa: E402
from klppo.experiments.tune import run_tune  # noqa: E402
from klppo.experiments.tune_spec import TuneSpec, load_tune_spec  # noqa: E402
from klppo.report.load import load_runs  # noqa: E402
from klppo.runs.metrics import read_metrics  # noqa: E402
from klppo.runs.protocol import final_return  # noqa: E402
from tests.signalguard import send_self  # noqa: E402

SPACE = {"ppo.lr": {"low": 1e-4, "high": 3e-3, "log": True},
         "ppo.update_epochs": {"low": 2, "high": 6},
         "objective": {"choices": ["clip", "per_sample_kl"]}}


def tiny(**kw) -> TuneSpec:
    d = {"preset": "klip/cartpole", "base": {"total_steps": 3072, "tensorboard": False},
         "space": SPACE, "trials": 4, "startup_trials": 1, **kw}
    return TuneSpec.from_dict(d)


def _runs(tune_dir: Path) -> dict[str, Path]:
    return {p.name: p for p in (tune_dir / "runs").iterdir()}


def test_a_tiny_study_scores_each_trial_by_the_final_return_of_its_run(tmp_path):
    res = run_tune(tiny(), tmp_path / "t")
    assert [t.number for t in res.trials] == [0, 1, 2, 3]
    assert {t.state for t in res.trials} == {"complete", "pruned"}  # seeded: both happen
    runs = _runs(tmp_path / "t")
    for t in res.trials:
        (name,) = t.runs
        run = runs[name]
        status = json.loads((run / "status.json").read_text())
        records, _ = read_metrics(run / "metrics.jsonl")
        if t.state == "complete":  # the value is the protocol over the run's own metrics
            assert status["state"] == "finished" and len(records) == 6
            assert t.value == pytest.approx(final_return(records))
        else:  # pruned: stopped early, with its checkpoint and the reason
            assert status["state"] == "pruned" and "pruned by klppo tune" in status["reason"]
            assert status["checkpoint_iteration"] == len(records) < 6
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        assert cfg["ppo"]["lr"] == t.params["ppo.lr"] and cfg["objective"] == t.params["objective"]
    index = json.loads((tmp_path / "t" / "index.json").read_text())
    assert [r["name"] for r in index["runs"]] == [t.runs[0] for t in res.trials]
    best = yaml.safe_load((tmp_path / "t" / "best_config.yaml").read_text())
    assert best["ppo"]["lr"] == res.best.params["ppo.lr"] and best["out"] is None
    loaded = load_runs([tmp_path / "t"])  # klppo report reads the study as a sweep of trials
    assert len(loaded.runs) == 4 and not loaded.skipped
    assert {r.condition for r in loaded.runs} == {
        f"trial{t.number:04d}" + (" (pruned)" if t.state == "pruned" else "") for t in res.trials}
    # Optuna's importances over the complete trials, for the report
    if sum(t.state == "complete" for t in res.trials) >= 2:
        assert set(index["importance"]) == set(SPACE)
        assert sum(index["importance"].values()) == pytest.approx(1.0)


def test_a_stopped_study_resumes_its_running_trial_exactly_and_runs_the_rest(tmp_path):
    """SIGINT during trial 1: its run stops at the iteration's end (checkpointed) and the study
    returns; the same call again resumes that run and finishes the budget. The resumed run's
    metrics equal an uninterrupted run of the same config."""
    seen = {"n": 0}

    def stop_in_trial_1(m):
        seen["n"] += 1
        if seen["n"] == 8:  # trial 0 has 6 iterations: this is trial 1's second
            send_self(signal.SIGINT)

    spec = tiny(pruner="none")
    first = run_tune(spec, tmp_path / "t", on_iteration=stop_in_trial_1)
    assert first.stop_signal == signal.SIGINT
    assert [t.state for t in first.trials] == ["complete", "running"]
    run1 = tmp_path / "t" / "runs" / first.trials[1].runs[0]
    assert json.loads((run1 / "status.json").read_text())["state"] == "interrupted"
    second = run_tune(spec, tmp_path / "t")
    assert second.stop_signal is None
    assert [t.state for t in second.trials] == ["complete"] * 4
    assert second.trials[1].params == first.trials[1].params
    meta = json.loads((run1 / "metadata.json").read_text())
    assert [r["iteration"] for r in meta["resumes"]] == [2]
    # the resumed run equals the same config trained without a stop
    import klppo.rl as rl
    from klppo.rl.trainer import TIMING_KEYS

    whole = rl.train(spec.config(second.trials[1].params, 0, str(tmp_path / "whole")))
    strip = [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in whole.metrics]
    resumed, _ = read_metrics(run1 / "metrics.jsonl")
    assert [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in resumed] == strip
    assert second.trials[1].value == pytest.approx(whole.final_return)


def test_more_trials_extend_a_study_and_another_spec_is_refused(tmp_path, capsys):
    spec_file = tmp_path / "s.yaml"
    spec_file.write_text(yaml.safe_dump({"base": {"total_steps": 1024, "tensorboard": False},
                                         "space": {"ppo.lr": {"low": 1e-4, "high": 1e-3}},
                                         "trials": 1, "pruner": "none"}))
    out = str(tmp_path / "t")
    assert main(["tune", "--spec", str(spec_file), "--out", out]) == 0
    assert main(["tune", "--spec", str(spec_file), "--out", out, "--trials", "2"]) == 0
    text = capsys.readouterr().out
    assert "[trial 1 2/2] complete" in text and "best: trial" in text
    assert len(json.loads((Path(out) / "index.json").read_text())["trials"]) == 2
    spec_file.write_text(spec_file.read_text().replace("0.001", "0.002"))
    assert main(["tune", "--spec", str(spec_file), "--out", out]) == 2
    assert "holds a study of another spec" in capsys.readouterr().err


BAD = {
    "unknown key": ({"spaces": {}}, "spaces={}: unknown tuning spec key"),
    "empty space": ({"space": {}}, "space={}: must be a non-empty mapping"),
    "low above high": ({"space": {"ppo.lr": {"low": 1e-2, "high": 1e-3}}},
                       "space.ppo.lr.high=0.001: must be greater than low=0.01"),
    "log below 0": ({"space": {"ppo.lr": {"low": 0.0, "high": 1e-3, "log": True}}},
                    "space.ppo.lr.low=0.0: must be > 0 on a log scale"),
    "unknown field": ({"space": {"ppo.learning_rate": {"low": 1e-4, "high": 1e-3}}},
                      "learning_rate"),
    "bad choice": ({"space": {"objective": {"choices": ["clip", "klip"]}}}, "'klip'"),
    "value out of range": ({"space": {"ppo.gamma": {"low": 0.9, "high": 1.5}}},
                           "ppo.gamma=1.5"),
    "reserved": ({"space": {"seed": {"low": 0, "high": 9}}}, "a tuning study sets seed"),
    "sampler": ({"sampler": "cmaes"}, "sampler='cmaes': must be one of tpe, random"),
    "trials": ({"trials": 0}, "trials=0: must be an integer in [1, 10,000]"),
    "multi-agent": ({"preset": "marl/simple_adversary"}, "maximises one return"),
    "step on log": ({"space": {"ppo.lr": {"low": 1e-4, "high": 1e-3, "log": True,
                                          "step": 1e-4}}}, "a log scale takes no step"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_specs_are_one_line_before_any_directory(case, tmp_path, capsys):
    over, needle = BAD[case]
    d = {"space": {"ppo.lr": {"low": 1e-4, "high": 1e-3}}, **over}
    spec_file = tmp_path / "s.yaml"
    spec_file.write_text(yaml.safe_dump(d))
    assert main(["tune", "--spec", str(spec_file), "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("klppo tune: "), err
    assert needle in err, err
    assert not (tmp_path / "t").exists()


def test_a_missing_spec_file_and_a_missing_optuna_are_one_line(tmp_path, capsys, monkeypatch):
    assert main(["tune", "--spec", str(tmp_path / "no.yaml"), "--out",
                 str(tmp_path / "t")]) == 2
    assert "no.yaml" in capsys.readouterr().err
    spec_file = tmp_path / "s.yaml"
    spec_file.write_text("space: {ppo.lr: {low: 0.0001, high: 0.001}}\n")
    assert load_tune_spec(spec_file).space == {"ppo.lr": {"low": 1e-4, "high": 1e-3}}
    monkeypatch.setitem(__import__("sys").modules, "optuna", None)
    assert main(["tune", "--spec", str(spec_file), "--out", str(tmp_path / "t")]) == 2
    assert "pip install -c constraints.txt -e '.[tune]'" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()


def test_sigint_of_a_real_klppo_tune_exits_130_and_the_same_command_finishes(tmp_path):
    import subprocess
    import sys

    from tests.waiting import wait_for_lines

    root = Path(__file__).resolve().parents[2]
    spec_file = tmp_path / "s.yaml"
    spec_file.write_text(yaml.safe_dump({"base": {"total_steps": 20480, "tensorboard": False},
                                         "space": {"ppo.lr": {"low": 1e-4, "high": 1e-3}},
                                         "trials": 1}))
    argv = [sys.executable, "-m", "klppo", "tune", "--spec", str(spec_file), "--out",
            str(tmp_path / "t")]
    proc = subprocess.Popen(argv, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    wait_for_lines(tmp_path / "t" / "runs" / "CartPole-v1__trial0000__0" / "metrics.jsonl", 3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "stopped by SIGINT; run the same command again" in out
    again = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "[trial 0 1/1] complete" in again.stdout


def _spec_file(tmp_path, **kw):
    d = {"preset": "klip/cartpole", "base": {"total_steps": 1024, "tensorboard": False},
         "space": {"ppo.minibatch_size": {"low": 32, "high": 512}}, "trials": 3,
         "pruner": "none", **kw}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


def test_invalid_draws_are_invalid_trials_said_once_and_never_exit_1(tmp_path, capsys):
    """A minibatch size must divide the rollout (512): most of 32..512 cannot. The space's
    problem is said once, at the start; each such draw is an ``invalid`` trial with its reason
    and no run directory; a study of only invalid draws exits 2 (the space, not a run), and a
    study with valid trials ends 0."""
    out = tmp_path / "study"
    assert main(["tune", "--spec", str(_spec_file(tmp_path)), "--out", str(out)]) == 2
    text = capsys.readouterr().out
    assert text.count("tune: note: space.ppo.minibatch_size: 476 of the 481 values checked "
                      "are invalid (e.g. ppo.minibatch_size=33: must divide") == 1
    index = json.loads((out / "index.json").read_text())
    assert [t["state"] for t in index["trials"]] == ["invalid"] * 3
    assert all("must divide the rollout size" in t["error"] for t in index["trials"])
    assert not list((out / "runs").iterdir())
    assert "every trial was an invalid draw" in text
    some = {"ppo.minibatch_size": {"low": 64, "high": 512, "step": 64}}  # 4 of 8 divide 512
    out2 = tmp_path / "study2"
    assert main(["tune", "--spec", str(_spec_file(tmp_path, space=some, sampler="random",
                                                  trials=6)), "--out", str(out2)]) == 0
    assert "4 of the 8 values checked are invalid" in capsys.readouterr().out
    states = [t["state"] for t in json.loads((out2 / "index.json").read_text())["trials"]]
    assert "complete" in states and "invalid" in states and "fail" not in states


def test_a_space_with_no_valid_value_and_a_damaged_journal_are_one_line(tmp_path, capsys):
    bad_choice = {"ppo.minibatch_size": {"choices": [64, 65]}}  # an explicit invalid value
    assert main(["tune", "--spec", str(_spec_file(tmp_path, space=bad_choice)), "--out",
                 str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ppo.minibatch_size=65: must divide" in err[0]
    assert not (tmp_path / "none").exists()
    out = tmp_path / "study"
    main(["tune", "--spec", str(_spec_file(tmp_path)), "--out", str(out)])
    capsys.readouterr()
    with open(out / "study.journal", "a") as f:
        f.write('{"broken\n')
    assert main(["tune", "--spec", str(_spec_file(tmp_path)), "--out", str(out),
                 "--trials", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{out / 'study.journal'}: cannot be read as Optuna's journal" \
        in err[0]


def test_a_continued_study_s_progress_names_the_best_of_every_trial(tmp_path, capsys):
    # a study continued with more trials: the progress line's "best" counts the earlier
    # invocations' trials (it named the new trials' best, then the summary another one)
    import json
    from types import SimpleNamespace

    from klppo.cli.tune import TuneProgress, _trials_so_far

    (tmp_path / "index.json").write_text(json.dumps({"trials": [
        {"number": 0, "state": "complete", "value": 300.0},
        {"number": 1, "state": "complete", "value": 497.4},
        {"number": 2, "state": "pruned", "value": 500.0},
        {"number": 3, "state": "complete", "value": 497.4}]}))
    done, best = _trials_so_far(str(tmp_path))
    assert (done, best) == (4, (497.4, 1))
    progress = TuneProgress(5, done, best)
    progress(SimpleNamespace(number=4, state="complete", value=279.19, error=None, params={}))
    progress.close()
    assert "best 497.40 (trial 1)" in capsys.readouterr().out
