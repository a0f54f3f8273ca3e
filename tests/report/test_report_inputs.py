"""``klppo report`` skips what it cannot read, says why, and goes on; a missing path is a one-line
error."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from klppo.cli import main
from klppo.report import figures as F
from klppo.report import make_report
from klppo.report.load import load_runs
from tests.report.test_report import fake_run

ROOT = Path(__file__).resolve().parents[2]


def write(path: Path, data: str | bytes) -> None:
    path.write_bytes(data if isinstance(data, bytes) else data.encode())


def as_directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


def lines(good: int, bad: str) -> str:
    """``good`` well-formed records (iterations 1.., 100 steps each) and then one record of the
    next iteration with the fields in ``bad`` (JSON text, e.g. ``'"global_step": 1e999'``)."""
    rec = '"iteration": {i}, "global_step": {s}, "episode_return_mean": 1.0, "episode_count": 1'
    out = ["{" + rec.format(i=i, s=100 * i) + "}" for i in range(1, good + 1)]
    base = json.loads("{" + rec.format(i=good + 1, s=100 * (good + 1)) + "}")
    keys = re.findall(r'"([^"]+)":', bad)
    head = ", ".join(f'"{k}": {json.dumps(v)}' for k, v in base.items() if k not in keys)
    return "\n".join(out + ["{" + head + ", " + bad + "}"]) + "\n"


#: (id, file of the bad run, what to do to it, the reason printed)
DAMAGE = [
    ("metrics-empty", "metrics.jsonl", "", "metrics.jsonl holds no complete record"),
    ("metrics-garbage", "metrics.jsonl", "not json\n{", "metrics.jsonl holds no complete record"),
    ("metrics-not-utf8", "metrics.jsonl", b"\xff\xfe{}\n", "metrics.jsonl holds no complete"),
    ("metrics-not-objects", "metrics.jsonl", "[1, 2]\n3\n\"x\"\n", "metrics.jsonl holds no"),
    ("metrics-strings", "metrics.jsonl",
     '{"global_step": 100, "episode_return_mean": "high", "episode_count": 1}\n',
     "metrics.jsonl line 1: episode_return_mean='high' is not a number"),
    ("metrics-a-directory", "metrics.jsonl", as_directory, "unreadable (IsADirectoryError"),
    ("metrics-missing", "metrics.jsonl", Path.unlink, "no metrics.jsonl"),
    ("config-bad-yaml", "config.yaml", "env: [1\n", "config.yaml is not valid YAML at line"),
    ("config-not-utf8", "config.yaml", b"env: \xff\n", "config.yaml is not UTF-8 text"),
    ("config-list", "config.yaml", "- env\n", "config.yaml holds a list, not a mapping"),
    ("config-empty", "config.yaml", "", "config.yaml is empty"),
    ("config-seed", "config.yaml", "env: Env-v0\nseed: one\n", "config.yaml: seed='one' is not"),
    ("config-kl-list", "config.yaml", "env: Env-v0\nkl: [1]\n", "config.yaml: kl=[1] is not a"),
    # multi-agent runs
    ("config-marl-list", "config.yaml", "env: Env-v0\nmarl: [1]\n",
     "config.yaml: marl=[1] is not a mapping"),
    ("config-marl-overrides", "config.yaml", "env: Env-v0\nmarl: {overrides: a:kl.beta=1}\n",
     "config.yaml: marl.overrides='a:kl.beta=1' is not a list"),
    ("metrics-policy-strings", "metrics.jsonl",
     '{"global_step": 100, "a/kl_rollout": 0.01, "a/kl_target": "low", "episode_count": 1}\n',
     "metrics.jsonl line 1: a/kl_target='low' is not a number"),
    # a complete line with a value the report cannot use: the run is skipped, naming the line
    ("metrics-step-inf", "metrics.jsonl", lines(1, '"global_step": 1e999'),
     "metrics.jsonl line 2: global_step=inf is not a finite number"),
    ("metrics-step-nan", "metrics.jsonl", lines(1, '"global_step": NaN'),
     "metrics.jsonl line 2: global_step=nan is not a finite number"),
    ("metrics-step-negative", "metrics.jsonl", lines(1, '"global_step": -200'),
     "metrics.jsonl line 2: global_step=-200 is not a whole number >= 0"),
    ("metrics-step-fraction", "metrics.jsonl", lines(1, '"global_step": 150.5'),
     "metrics.jsonl line 2: global_step=150.5 is not a whole number >= 0"),
    ("metrics-step-null", "metrics.jsonl", lines(1, '"global_step": null'),
     "metrics.jsonl line 2: global_step=None is not a number"),
    ("metrics-step-string", "metrics.jsonl", lines(1, '"global_step": "200"'),
     "metrics.jsonl line 2: global_step='200' is not a number"),
    ("metrics-no-step", "metrics.jsonl", '{"iteration": 1, "episode_count": 0}\n',
     "metrics.jsonl line 1: no global_step"),
    ("metrics-step-backwards", "metrics.jsonl", lines(2, '"iteration": 3, "global_step": 50'),
     "metrics.jsonl line 3: global_step=50 after 200: must increase"),
    ("metrics-return-inf", "metrics.jsonl", lines(1, '"episode_return_mean": -Infinity'),
     "metrics.jsonl line 2: episode_return_mean=-inf is not a finite number"),
    ("metrics-return-bool", "metrics.jsonl", lines(1, '"episode_return_mean": true'),
     "metrics.jsonl line 2: episode_return_mean=True is not a number"),
    ("metrics-count-negative", "metrics.jsonl", lines(1, '"episode_count": -3'),
     "metrics.jsonl line 2: episode_count=-3 is not a whole number >= 0"),
    ("metrics-beta-nan", "metrics.jsonl", lines(1, '"beta": NaN'),
     "metrics.jsonl line 2: beta=nan is not a finite number"),
    ("metrics-policy-inf", "metrics.jsonl", lines(1, '"a/kl_rollout": 1e999'),
     "metrics.jsonl line 2: a/kl_rollout=inf is not a finite number"),
    ("metrics-iteration-backwards", "metrics.jsonl", lines(2, '"iteration": 1, "global_step": 300'),
     "metrics.jsonl line 3: iteration=1 after 2: must increase line by line"),
    ("metrics-iteration-duplicated", "metrics.jsonl",
     lines(2, '"iteration": 2, "global_step": 300'),
     "metrics.jsonl line 3: iteration=2 after 2: must increase line by line"),
    ("metrics-iteration-string", "metrics.jsonl", lines(1, '"iteration": "2"'),
     "metrics.jsonl line 2: iteration='2' is not a whole number >= 0"),
    ("metrics-iteration-float", "metrics.jsonl", lines(1, '"iteration": 2.0'),
     "metrics.jsonl line 2: iteration=2.0 is not a whole number >= 0"),
    # a run directory of another command, or a config without the fields the report reads
    ("config-rlhf", "config.yaml", "kind: rlhf\nmodel: runs/lm/base\nseed: 0\n",
     "an RLHF run (config.yaml kind: rlhf)"),
    ("config-no-env", "config.yaml", "objective: clip\nseed: 0\n",
     "config.yaml: env=None is not a name"),
    ("config-env-list", "config.yaml", "env: [CartPole-v1]\nobjective: clip\n",
     "config.yaml: env=['CartPole-v1'] is not a name"),
    ("config-objective-number", "config.yaml", "env: Env-v0\nobjective: 3\n",
     "config.yaml: objective=3 is not a name"),
]


@pytest.mark.parametrize("case", DAMAGE, ids=[c[0] for c in DAMAGE])
def test_a_bad_run_is_skipped_with_its_reason_and_the_rest_is_loaded(tmp_path, case):
    _, name, damage, reason = case
    fake_run(tmp_path, "good", "Env-v0", "clip", 0, [1.0] * 5)
    bad = fake_run(tmp_path, "bad", "Env-v0", "clip", 1, [2.0] * 5)
    if callable(damage):
        damage(bad / name)
    else:
        write(bad / name, damage)
    loaded = load_runs([tmp_path])
    assert [r.path.name for r in loaded.runs] == ["good"]
    ((path, why),) = loaded.skipped
    assert path == str(bad) and why.startswith(reason) and "\n" not in why


def test_the_report_command_prints_what_it_skipped_and_goes_on(tmp_path, capsys):
    fake_run(tmp_path / "runs", "good", "Env-v0", "clip", 0, [1.0] * 5)
    bad = fake_run(tmp_path / "runs", "bad", "Env-v0", "clip", 1, [2.0] * 5)
    write(bad / "metrics.jsonl", b"\xff\xfe")
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 0
    cap = capsys.readouterr()
    assert f"skipped {bad}: metrics.jsonl holds no complete record" in cap.out.splitlines()
    assert "| Env-v0 | clip | 1 |" in cap.out  # the good run is in the table
    assert "Traceback" not in cap.out + cap.err


def test_an_unreadable_status_is_not_a_reason_to_skip(tmp_path):
    run = fake_run(tmp_path, "r", "Env-v0", "clip", 0, [1.0] * 5)
    write(run / "status.json", b"\xff[")
    loaded = load_runs([run])
    assert loaded.skipped == [] and loaded.runs[0].status is None


@pytest.mark.parametrize("index, reason", [
    (b"{\"runs\": [", "index.json is unreadable (JSONDecodeError"),
    (b"{\"runs\": [\"\xff\"]}", "index.json is unreadable (UnicodeDecodeError"),
    (b"[1, 2]", "index.json holds no list of runs"),
], ids=["truncated", "not-utf8", "a-list"])
def test_a_sweep_with_a_bad_index_is_skipped(tmp_path, index, reason):
    fake_run(tmp_path, "good", "Env-v0", "clip", 0, [1.0] * 5)
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    write(sweep / "index.json", index)
    loaded = load_runs([tmp_path / "good", sweep])
    assert len(loaded.runs) == 1
    ((path, why),) = loaded.skipped
    assert path == str(sweep) and why.startswith(reason)


def test_index_entries_that_name_no_run_are_skipped(tmp_path):
    sweep = tmp_path / "sweep"
    fake_run(sweep / "runs", "a", "Env-v0", "clip", 0, [1.0] * 5)
    write(sweep / "index.json", json.dumps({"runs": [{"name": "a", "condition": 3}, 7, {}]}))
    loaded = load_runs([sweep])
    assert [r.condition for r in loaded.runs] == ["3"]
    assert [why for _, why in loaded.skipped] == ["entry 7 names no run", "entry {} names no run"]


def test_an_index_entry_that_leaves_the_sweep_is_never_read(tmp_path):
    fake_run(tmp_path / "runs", "outside", "Env-v0", "clip", 0, [1.0] * 5)
    sweep = tmp_path / "sweep"
    fake_run(sweep / "runs", "a", "Env-v0", "clip", 0, [1.0] * 5)
    write(sweep / "index.json", json.dumps({"runs": [{"name": "a"},
                                                     {"name": "../../runs/outside"}]}))
    loaded = load_runs([sweep])
    assert len(loaded.runs) == 1
    assert "is not a run name" in loaded.skipped[0][1]


@pytest.mark.parametrize("what", ["missing", "file-as-out"])
def test_a_missing_path_or_a_file_as_out_is_one_line_and_creates_nothing(tmp_path, capsys, what):
    fake_run(tmp_path, "good", "Env-v0", "clip", 0, [1.0] * 5)
    (tmp_path / "file").write_text("")
    if what == "missing":
        argv, expected = [str(tmp_path / "nope"), "--out", str(tmp_path / "out")], \
            f"klppo report: {tmp_path / 'nope'}: does not exist"
    else:
        argv, expected = [str(tmp_path / "good"), "--out", str(tmp_path / "file")], \
            f"klppo report: --out={str(tmp_path / 'file')!r}: exists and is not a directory"
    assert main(["report", *argv]) == 2
    cap = capsys.readouterr()
    assert cap.err.splitlines() == [expected] and cap.out == ""
    assert not (tmp_path / "out").exists()


def test_a_real_report_process_prints_no_traceback(tmp_path):
    run = fake_run(tmp_path, "r", "Env-v0", "clip", 0, [1.0] * 5)
    write(run / "config.yaml", yaml.safe_dump(["not", "a", "mapping"]))
    proc = subprocess.run([sys.executable, "-m", "klppo", "report", str(run), str(tmp_path / "x"),
                           "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [f"klppo report: {tmp_path / 'x'}: does not exist"]


#: (id, metrics of a legal run the report must still draw, the axes' y scales: KL, beta)
EDGE_RUNS = [
    ("fixed-beta-0", {"beta": 0.0, "kl_observed": 0.01}, ("log", "linear")),
    ("kl-never-positive", {"beta": 1.0, "kl_observed": -0.001}, ("linear", "log")),
    ("kl-and-beta-null", {"beta": None, "kl_observed": None}, ("linear", "linear")),
]


@pytest.mark.parametrize("case", EDGE_RUNS, ids=[c[0] for c in EDGE_RUNS])
def test_a_legal_run_with_nothing_above_zero_is_drawn_on_a_linear_axis(tmp_path, case):
    _, extra, scales = case
    fake_run(tmp_path / "runs", "r", "Env-v0", "kl_penalty", 0, [1.0] * 5, extra=extra,
             kl={"controller": "fixed", "beta": 0.0})
    rep = make_report([tmp_path / "runs"], tmp_path / "out")
    assert rep.skipped == [] and rep.summaries[0].mean == 1.0
    fig = F.kl_tracking("Env-v0", "c", load_runs([tmp_path / "runs"]).runs)
    assert tuple(a.get_yscale() for a in fig.axes[:2]) == scales


def test_a_run_with_no_final_return_is_noted(tmp_path):
    fake_run(tmp_path, "r", "Env-v0", "clip", 0, [1.0, None, None, None, None])
    rep = make_report([tmp_path / "r"], tmp_path / "out")
    assert any("no training episode ended in the last 10% of the steps" in n for n in rep.notes)


@pytest.mark.parametrize("value", ["1e999", "1e308"], ids=["inf", "float-limit"])
def test_a_real_report_process_prints_no_numeric_warning(tmp_path, value):
    """global_step=inf skips the run naming the line; a finite return at the float limit
    (a run logs +-inf as +-1e308) is reported: no numpy or matplotlib warning either way."""
    fake_run(tmp_path / "runs", "good", "Env-v0", "kl_penalty", 0, [1.0] * 5)
    bad = fake_run(tmp_path / "runs", "bad", "Env-v0", "kl_penalty", 1, [1.0] * 5)
    field = "global_step" if value == "1e999" else "episode_return_mean"
    write(bad / "metrics.jsonl", lines(1, f'"{field}": {value}, "kl_rollout": {value}'))
    proc = subprocess.run([sys.executable, "-m", "klppo", "report", str(tmp_path / "runs"),
                           "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    skipped = [x for x in proc.stdout.splitlines() if x.startswith("skipped")]
    if value == "1e999":
        assert skipped == [f"skipped {bad}: metrics.jsonl line 2: global_step=inf is not a "
                           "finite number"]
    else:
        assert skipped == []
