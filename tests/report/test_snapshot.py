"""docs/results snapshots: written by a command, with the machine the numbers came from."""

import json
from pathlib import Path

from klppo.cli import main as klppo_main
from klppo.report.load import describe_machine
from klppo.report.snapshot import FLOAT_NOTE, write_snapshot
from tests.report.test_report import fake_run

ROOT = Path(__file__).resolve().parents[2]

META = {"klppo_version": "0.1.0", "git_commit": "0123456789abcdef", "python": "3.11.7",
        "packages": {"torch": "2.13.0+cpu"}, "platform": "Linux-6.1-x86_64",
        "machine": {"cpu": "AMD EPYC", "cpu_count": 2, "arch": "x86_64", "gpu": None}}
MACHINE = ("AMD EPYC CPU (2 logical cores), no GPU, Linux-6.1-x86_64, Python 3.11.7, "
           "torch 2.13.0+cpu, klppo 0.1.0 (0123456789)")


def test_describe_machine():
    assert describe_machine(META) == MACHINE
    gpu = {**META, "machine": {**META["machine"], "gpu": "NVIDIA H100"}}
    assert "GPU NVIDIA H100" in describe_machine(gpu)
    old = {"platform": "Linux-5", "python": "3.11.7"}  # before the machine field
    assert describe_machine(old) == "Linux-5, Python 3.11.7"
    assert describe_machine({}) == "not recorded (no metadata.json)"


def test_snapshot_names_the_machine_and_the_command(tmp_path):
    for seed in (0, 1):
        for obj in ("clip", "per_sample_kl"):
            d = fake_run(tmp_path / "runs", f"{obj}{seed}", "Env-v0", obj, seed, [1.0, 2.0])
            (d / "metadata.json").write_text(json.dumps(META))
    rep = write_snapshot([tmp_path / "runs"], tmp_path / "snap", "Demo", "make demo-table")
    md = (tmp_path / "snap" / "final_returns.md").read_text()
    assert md.startswith("# Demo\n")
    assert f"Measured on: {MACHINE}." in md and FLOAT_NOTE in md
    assert "Regenerate with `make demo-table`" in md
    assert "| Env-v0 | clip | 2 | 2.0 ± 0.0 |" in md
    eq = (tmp_path / "snap" / "equivalence.md").read_text()
    assert f"Measured on: {MACHINE}." in eq and "| Env-v0 | 1 | 2 | 0 |" in eq
    html = (tmp_path / "snap" / "report.html").read_text()
    assert "Measured on" in html and "AMD EPYC CPU" in html
    assert sorted(p.name for p in (tmp_path / "snap").iterdir()) == [
        "aggregates.md", "equivalence.md", "final_returns.md", "partition.md", "report.html"]
    agg = (tmp_path / "snap" / "aggregates.md").read_text()
    assert f"Measured on: {MACHINE}." in agg and "| P(row > column) | clip | per_sample_kl |" in agg
    part = (tmp_path / "snap" / "partition.md").read_text()
    assert f"Measured on: {MACHINE}." in part
    assert "| Env-v0 | clip | 2 | 0.100 (100) | - | 0 ± 0 | 0.5 ± 0 | 1 ± 0 |" in part
    assert rep.machines == [MACHINE]


def test_a_run_resumed_elsewhere_names_both_machines(tmp_path):
    other = {**META, "machine": {**META["machine"], "cpu": "Intel Xeon", "cpu_count": 16},
             "packages": {"torch": "2.11.0"}}
    for seed, resumes in ((0, [{**other, "iteration": 7}]), (1, [{**META, "iteration": 3}])):
        d = fake_run(tmp_path / "runs", f"clip{seed}", "Env-v0", "clip", seed, [1.0, 2.0])
        (d / "metadata.json").write_text(json.dumps({**META, "resumes": resumes}))
    rep = write_snapshot([tmp_path / "runs"], tmp_path / "snap", "T", "c")
    xeon = ("Intel Xeon CPU (16 logical cores), no GPU, Linux-6.1-x86_64, Python 3.11.7, "
            "torch 2.11.0")
    assert rep.machines == sorted([MACHINE, xeon + ", klppo 0.1.0 (0123456789)"])
    md = (tmp_path / "snap" / "final_returns.md").read_text()
    assert f"- {MACHINE}" in md and f"- {xeon}" in md
    # the run resumed on the same machine gets no note; the other one says where it went on
    assert rep.notes == [f"{tmp_path / 'runs' / 'clip0'}: resumed at iteration 7 on another "
                         f"machine or software: {xeon}, klppo 0.1.0 (0123456789)"]


def test_finished_only_leaves_out_unfinished_runs(tmp_path, capsys):
    from klppo.cli import main as klppo

    fake_run(tmp_path / "runs", "done", "Env-v0", "clip", 0, [1.0, 2.0])
    part = fake_run(tmp_path / "runs", "part", "Env-v0", "clip", 1, [5.0, 6.0])
    (part / "status.json").write_text(json.dumps({"state": "interrupted"}))
    rep = write_snapshot([tmp_path / "runs"], tmp_path / "snap", "T", "c", finished_only=True)
    assert [s.per_seed for s in rep.summaries] == [{0: 2.0}]
    assert any("not finished" in why for _, why in rep.skipped)
    assert klppo(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "rep"),
                  "--finished-only"]) == 0
    assert "not finished (status 'interrupted'" in capsys.readouterr().out
    assert klppo(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "rep2")]) == 0
    assert "| Env-v0 | clip | 2 |" in capsys.readouterr().out


def test_snapshot_command(tmp_path, capsys):
    fake_run(tmp_path / "runs", "a", "Env-v0", "clip", 0, [1.0, 2.0])
    assert klppo_main(["snapshot", str(tmp_path / "runs"), str(tmp_path / "snap"),
                       "--title", "T", "--smooth", "2"]) == 0
    assert "over 2 iterations" in (tmp_path / "snap" / "report.html").read_text()
    assert "not recorded" in (tmp_path / "snap" / "final_returns.md").read_text()
    (tmp_path / "empty").mkdir()
    assert klppo_main(["snapshot", str(tmp_path / "empty"), str(tmp_path / "s2")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("klppo snapshot: ") and "no readable run" in err


def test_docs_results_snapshots_name_their_machine():
    docs = ROOT / "docs" / "results"
    snapshots = [p for p in docs.rglob("*.md") if p.name != "README.md"]
    assert len(snapshots) >= 5
    for p in snapshots:
        text = p.read_text()
        assert "Measured on" in text and "differ across machines" in text, p
    readme = (docs / "README.md").read_text()
    assert "differ across machines" in readme and "make demo-table" in readme
    demo = (docs / "cartpole-demo" / "final_returns.md").read_text()
    assert "Regenerate with `make demo-table`" in demo


def test_make_demo_table_regenerates_the_demo_snapshot():
    make = (ROOT / "Makefile").read_text()
    target = make.split("\ndemo-table:", 1)[1].split("\n\n", 1)[0]
    assert "klppo demo --out runs/demo" in target
    assert "klppo snapshot runs/demo docs/results/cartpole-demo" in target


def test_machine_lines_that_differ_only_in_the_commit_are_merged():
    from klppo.report.load import merge_commits

    lines = ["A, klppo 0.1.0 (bbb)", "A, klppo 0.1.0", "A, klppo 0.1.0 (aaa)",
             "B, klppo 0.1.0", "B, klppo 0.2.0 (ccc)", "not recorded (no metadata.json)"]
    assert merge_commits(lines) == [
        "A, klppo 0.1.0 (aaa, bbb; some runs without a recorded commit)", "B, klppo 0.1.0",
        "B, klppo 0.2.0 (ccc)", "not recorded (no metadata.json)"]
    assert merge_commits([MACHINE, MACHINE]) == [MACHINE]
