"""``klppo report`` skips what it cannot read, says why, and goes on; a missing path is a one-line
error."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from klppo.cli import main
from klppo.report.load import load_runs
from tests.report.test_report import fake_run

ROOT = Path(__file__).resolve().parents[2]


def write(path: Path, data: str | bytes) -> None:
    path.write_bytes(data if isinstance(data, bytes) else data.encode())


def as_directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


#: (id, file of the bad run, what to do to it, the reason printed)
DAMAGE = [
    ("metrics-empty", "metrics.jsonl", "", "metrics.jsonl holds no complete record"),
    ("metrics-garbage", "metrics.jsonl", "not json\n{", "metrics.jsonl holds no complete record"),
    ("metrics-not-utf8", "metrics.jsonl", b"\xff\xfe{}\n", "metrics.jsonl holds no complete"),
    ("metrics-not-objects", "metrics.jsonl", "[1, 2]\n3\n\"x\"\n", "metrics.jsonl holds no"),
    ("metrics-strings", "metrics.jsonl",
     '{"global_step": 100, "episode_return_mean": "high", "episode_count": 1}\n',
     "metrics.jsonl holds no complete record"),
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
     "metrics.jsonl holds no complete record"),
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
