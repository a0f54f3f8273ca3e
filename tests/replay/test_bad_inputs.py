"""Bad input to `klppo replay`: one line on stderr naming the flag or file and the value, exit
status 2, no traceback, and no output directory created."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.badinput import assert_one_line_error, run_main, tree

ROOT = Path(__file__).resolve().parents[2]

JSONL_OK = "".join(json.dumps({"global_step": 10 * i, "kl_observed": 0.01 * i}) + "\n"
                   for i in range(1, 4))
#: a multi-agent run's metrics: each policy's under its prefix
MARL_OK = "".join(json.dumps({"global_step": 10 * i, **{
    f"{p}/{k}": 0.01 * i for p in ("adversary", "agent") for k in ("kl_rollout", "kl_observed")},
    "adversary/kl_target": 0.004, "agent/kl_target": 0.01}) + "\n" for i in range(1, 4))


def _file(name: str, data: str | bytes):
    """A trace file written before the call (its path replaces ``{trace}``)."""
    return name, data


CL = ["--closed-loop"]
T = ["{trace}"]

CASES = {
    # closed-loop flags
    "steps_zero": (CL + ["--steps", "0"], None, ["--steps=0", ">= 1"]),
    "steps_negative": (CL + ["--steps", "-3"], None, ["--steps=-3"]),
    "steps_not_int": (CL + ["--steps", "abc"], None, ["--steps", "'abc'"]),
    "noise_negative": (CL + ["--noise", "-1"], None, ["--noise=-1.0", ">= 0"]),
    "noise_nan": (CL + ["--noise", "nan"], None, ["--noise=nan"]),
    "drift_inf": (CL + ["--drift", "inf"], None, ["--drift=inf", "finite"]),
    "seed_negative": (CL + ["--seed", "-1"], None, ["--seed=-1"]),
    "target_zero": (CL + ["--target", "0"], None, ["--target=0.0", "> 0"]),
    "target_negative": (CL + ["--target", "-0.02"], None, ["--target=-0.02"]),
    "target_nan": (CL + ["--target", "nan"], None, ["--target=nan"]),
    "controller_option_twice": (CL + ["--controller", "fixed:beta=1,beta=2"], None,
                                ["controller='fixed:beta=1,beta=2'", "beta is given twice"]),
    # the plant's flags: bounded so that its KL stays a float; only with --closed-loop
    "drift_huge": (CL + ["--drift", "1e308"], None, ["--drift=1e+308", "within +-100"]),
    "drift_huge_negative": (CL + ["--drift=-1e308"], None, ["--drift=-1e+308"]),
    "drift_nan": (CL + ["--drift", "nan"], None, ["--drift=nan", "finite"]),
    "noise_huge": (CL + ["--noise", "1e200"], None, ["--noise=1e+200", "<= 10"]),
    "noise_inf": (CL + ["--noise", "inf"], None, ["--noise=inf"]),
    "steps_huge": (CL + ["--steps", "1000000000"], None, ["--steps=1000000000", "100,000"]),
    "seed_huge": (CL + ["--seed", str(2**32)], None, [f"--seed={2**32}"]),
    "target_inf": (CL + ["--target", "inf"], None, ["--target=inf"]),
    "steps_with_trace": (T + ["--steps", "5"], _file("t.csv", "kl\n0.1\n"),
                         ["--steps=5", "only used with --closed-loop"]),
    "seed_with_trace": (T + ["--seed", "3"], _file("t.csv", "kl\n0.1\n"),
                        ["--seed=3", "only used with --closed-loop"]),
    "drift_with_trace": (T + ["--drift", "2"], _file("t.csv", "kl\n0.1\n"),
                         ["--drift=2.0", "only used with --closed-loop"]),
    "noise_with_trace": (T + ["--noise", "0"], _file("t.csv", "kl\n0.1\n"),
                         ["--noise=0.0", "only used with --closed-loop"]),
    # a controller whose beta leaves the floats: named with the update
    "controller_overflows_closed_loop": (CL + ["--controller", "pid:kp=1e308,ki=1e308"], None,
                                         ["controller='pid:kp=1e308,ki=1e308'", "beta=inf",
                                          "not finite"]),
    "controller_overflows_open_loop": (
        T + ["--controller", "proportional:beta=1,horizon=1e-300"],
        _file("t.csv", "kl\n0.5\n1e300\n"),
        ["controller='proportional:beta=1,horizon=1e-300'", "update 2", "not finite"]),
    # controllers
    "controller_unknown": (CL + ["--controller", "foo"], None, ["controller='foo'", "one of"]),
    "controller_bad_beta": (CL + ["--controller", "proportional:beta=-1"], None,
                            ["controller='proportional:beta=-1'", "beta"]),
    "controller_bad_preset": (CL + ["--controller", "step:preset=nope"], None,
                              ["controller='step:preset=nope'", "preset"]),
    "controller_no_equals": (CL + ["--controller", "fixed:beta"], None,
                             ["controller='fixed:beta'", "key=value"]),
    "controller_not_number": (CL + ["--controller", "pid:kp=x"], None, ["controller='pid:kp=x'"]),
    "controller_unknown_option": (CL + ["--controller", "fixed:bogus=1"], None,
                                  ["controller='fixed:bogus=1'", "bogus"]),
    "controller_twice": (CL + ["--controller", "fixed:beta=1", "fixed:beta=1"], None,
                         ["--controller='fixed:beta=1'", "twice"]),
    # trace vs closed loop
    "neither": ([], None, ["trace=None", "--closed-loop"]),
    "both": (CL + T, _file("t.csv", "kl\n0.1\n"), ["trace=", "not used with --closed-loop"]),
    # trace files
    "trace_missing": (["{tmp}/nope.csv"], None, ["trace=", "nope.csv", "no such file"]),
    "trace_empty": (T, _file("t.csv", ""), ["trace=", "empty file"]),
    "trace_blank": (T, _file("t.jsonl", "\n  \n"), ["trace=", "empty file"]),
    "trace_not_utf8": (T, _file("t.csv", b"kl\n0.1\xff\n"), ["trace=", "not UTF-8", "0xff"]),
    "trace_dir_without_metrics": (["{tmp}"], None, ["trace=", "without metrics.jsonl"]),
    "jsonl_bad_middle_line": (T, _file("t.jsonl", '{"kl": 1}\nnot json\n{"kl": 2}\n'),
                              ["trace=", "line 2", "not JSON"]),
    "jsonl_not_objects": (T, _file("t.jsonl", "[1, 2]\n"), ["trace=", "line 1", "JSON object"]),
    "jsonl_no_column": (T, _file("t.jsonl", '{"loss": 1}\n'), ["trace=", "no values in column"]),
    "jsonl_column_missing": (T + ["--column", "kl_x"], _file("t.jsonl", JSONL_OK),
                             ["trace=", "'kl_x'"]),
    "jsonl_value_not_number": (T, _file("t.jsonl", '{"kl_observed": "high"}\n'),
                               ["trace=", "line 1", "kl_observed='high'"]),
    "jsonl_bad_target": (T, _file("t.jsonl", '{"kl_observed": 0.1, "kl_target": -1}\n'),
                         ["trace=", "kl_target=-1"]),
    "jsonl_value_inf": (T, _file("t.jsonl", '{"kl_observed": Infinity}\n'),
                        ["trace=", "line 1", "kl_observed=inf", "not a finite number"]),
    "jsonl_step_nan": (T, _file("t.jsonl", '{"global_step": NaN, "kl_observed": 0.1}\n'),
                       ["trace=", "line 1", "global_step=nan"]),
    "csv_no_column": (T, _file("t.csv", "step,loss\n0,1\n"), ["trace=", "no column 'kl'"]),
    "csv_not_number": (T, _file("t.csv", "kl\n0.1\nhigh\n"), ["trace=", "row 3", "kl='high'"]),
    "csv_nan": (T, _file("t.csv", "kl\nnan\n"), ["trace=", "row 2", "not a finite number"]),
    "csv_bad_step": (T, _file("t.csv", "step,kl\nfirst,0.1\n"), ["trace=", "step='first'"]),
    "csv_short_row": (T, _file("t.csv", "step,kl\n0\n"), ["trace=", "kl=None"]),
    "column_blank": (T + ["--column", " "], _file("t.csv", "kl\n0.1\n"), ["--column=' '"]),
    # multi-agent traces (--policy)
    "marl_without_policy": (T, _file("t.jsonl", MARL_OK),
                            ["trace=", "multi-agent", "'adversary', 'agent'", "--policy"]),
    "policy_unknown": (T + ["--policy", "bob"], _file("t.jsonl", MARL_OK),
                       ["--policy='bob'", "not a policy", "'adversary', 'agent'"]),
    "policy_on_single_agent_run": (T + ["--policy", "agent"], _file("t.jsonl", JSONL_OK),
                                   ["--policy='agent'", "trace=", "single-agent"]),
    "policy_on_csv": (T + ["--policy", "agent"], _file("t.csv", "kl\n0.1\n"),
                      ["--policy='agent'", "trace=", "CSV"]),
    "policy_blank": (T + ["--policy", " "], _file("t.jsonl", MARL_OK), ["--policy=' '"]),
    "policy_with_closed_loop": (CL + ["--policy", "agent"], None,
                                ["--policy='agent'", "--closed-loop"]),
    "policy_column_missing": (T + ["--policy", "agent", "--column", "kl_x"],
                              _file("t.jsonl", MARL_OK), ["trace=", "'agent/kl_x'"]),
    "policy_bad_target": (T + ["--policy", "agent"], _file("t.jsonl", MARL_OK.replace(
        '"agent/kl_target": 0.01', '"agent/kl_target": -1')), ["trace=", "agent/kl_target=-1"]),
    # output
    "out_is_file": (CL + ["--out", "{tmp}/f"], None, ["out=", "not a directory"]),
    "out_under_file": (CL + ["--out", "{tmp}/f/o"], None, ["out=", "is a file"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_replay_bad_input(case, tmp_path, capsys):
    flags, trace, needles = CASES[case]
    (tmp_path / "f").write_text("x")
    path = ""
    if trace is not None:
        name, data = trace
        path = str(tmp_path / name)
        Path(path).write_bytes(data.encode() if isinstance(data, str) else data)
    argv = [a.format(trace=path, tmp=tmp_path) for a in flags]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "o")]
    before = tree(tmp_path)
    rc = run_main(["replay", *argv])
    assert_one_line_error(rc, capsys.readouterr().err, 2, "replay", needles)
    assert tree(tmp_path) == before, "a refused replay must create nothing"


def test_a_torn_last_line_is_still_read(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text(JSONL_OK + '{"global_step": 40, "kl_obs')
    assert run_main(["replay", str(tmp_path), "--out", str(tmp_path / "o")]) == 0
    assert "wrote" in capsys.readouterr().out


@pytest.mark.parametrize("argv, needles", [
    (["replay", "--closed-loop", "--steps", "0"], ["--steps=0"]),
    (["replay", "{tmp}/nope.jsonl"], ["trace=", "no such file"]),
    (["replay", "--closed-loop", "--policy", "agent"], ["--policy='agent'"]),
])
def test_real_subprocess_bad_input(argv, needles, tmp_path):
    argv = [a.format(tmp=tmp_path) for a in argv]
    proc = subprocess.run([sys.executable, "-m", "klppo", *argv, "--out", str(tmp_path / "o")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert_one_line_error(proc.returncode, proc.stderr, 2, "replay", needles)
    assert list(tmp_path.iterdir()) == []


def test_a_trace_with_kl_at_or_below_zero_is_replayed_and_says_how_it_counts(tmp_path, capsys):
    """A noisy KL estimate can be negative: the controllers get it as in training, and the
    trace's tracking error counts it as 1000x below the target (never nan), for each target
    (the rllib preset keeps its own 0.01, the replay's is 0.02)."""
    (tmp_path / "t.csv").write_text("kl\n0.02\n-0.01\n0\n-0.002\n")
    assert run_main(["replay", str(tmp_path / "t.csv"), "--out", str(tmp_path / "o"),
                     "--controller", "fixed:beta=0", "step:preset=rllib"]) == 0
    cap = capsys.readouterr()
    assert cap.err == "" and "nan" not in cap.out
    assert "note: 3 of 4 KL values are below 0.001 x the target 0.02" in cap.out
    lines = [x for x in cap.out.splitlines() if x.startswith("the trace against target")]
    # 0.02 is within the band of 0.02 only (overshoot 0 after it), never of 0.01
    assert lines == [f"the trace against target {t}: tracking_error {math.log(1000):.3g}, "
                     f"overshoot {o}, settling_time -" for t, o in ((0.01, "-"), (0.02, "0"))]


def test_a_panel_with_nothing_above_zero_is_linear():
    from klppo.replay.plots import lab_figure

    fig = lab_figure([0, 1], {"trace": [-0.01, 0.0]}, {"fixed:beta=0": [0.0, 0.0],
                                                      "b": [0.0, 0.0]}, 0.02, "t")
    assert [a.get_yscale() for a in fig.axes[:2]] == ["linear", "linear"]
    fig = lab_figure([0, 1], {"trace": [-0.01, 0.1]}, {"b": [0.5, 1.0]}, 0.02, "t")
    assert [a.get_yscale() for a in fig.axes[:2]] == ["log", "log"]
    # a beta of 0 (or 20 decades down) stays on the axis: linear near 0, log above
    fig = lab_figure([0, 1], {"trace": [-0.01, 0.1]}, {"b": [0.0, 1.0]}, 0.02, "t")
    assert [a.get_yscale() for a in fig.axes[:2]] == ["log", "symlog"]


def test_a_drift_that_would_overflow_is_one_line_in_a_real_process(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "klppo", "replay", "--closed-loop", "--drift",
                           "1e308", "--out", str(tmp_path / "o")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert_one_line_error(proc.returncode, proc.stderr, 2, "replay", ["--drift=1e+308"])
    assert list(tmp_path.iterdir()) == []
