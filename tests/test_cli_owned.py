"""Outputs are owned (issue #32): ``klppo eval``, ``report``, ``replay`` and ``snapshot`` refuse,
before any work and whatever ``--force`` says, a destination that would replace a file that a
real (tiny) run or sweep owns: exit 2, one line naming the file, the file's bytes untouched.
Given as the path itself and through a link named as the command's own output (which, before
the check, ``--force`` wrote through). Each command's own output still works, and ``--force``
still replaces only that."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.badinput import assert_one_line_error, run_main
from tests.runs.test_owned import EXTRA, TRAINED, add_extra_files, tiny_run, tiny_sweep

#: the one run of the tiny sweep
SWEEP_RUN = "CartPole-v1__base__0"
#: files the tiny run owns (relative to the test root)
RUN_TARGETS = [f"run/{n}" for n in TRAINED + EXTRA]
#: files the tiny sweep owns, and its run's
SWEEP_TARGETS = (["sweep/spec.yaml", "sweep/index.json", "sweep/.lock"]
                 + [f"sweep/runs/{SWEEP_RUN}/{n}" for n in TRAINED + ("worker.log",)])
#: per command: its first own output file (a link named so leads to the target)
OWN_FILE = {"eval": "eval.json", "report": "report.html", "replay": "replay.csv",
            "snapshot": "final_returns.md"}
#: the commands that have --force
FORCE = {"eval": [False, True], "report": [False, True], "replay": [False, True],
         "snapshot": [False]}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """tmp/run (a run with every file a run can own) and tmp/sweep (a sweep of one run)."""
    root = tmp_path_factory.mktemp("cli_owned")
    add_extra_files(tiny_run(root / "run"))
    _, run = tiny_sweep(root / "sweep")
    assert run.name == SWEEP_RUN
    return root


@pytest.fixture
def at_root(root, monkeypatch):
    """Work in the root: the paths (and so the messages) are short, as a user's are."""
    monkeypatch.chdir(root)
    return root


def _bytes(root: Path) -> dict[str, bytes]:
    """Every file of the run and the sweep, by path."""
    return {str(p.relative_to(root)): p.read_bytes() for top in ("run", "sweep")
            for p in sorted((root / top).rglob("*")) if p.is_file()}


def _owned(root: Path) -> dict[str, bytes]:
    """The bytes of every file the run and the sweep own (the targets)."""
    return {t: (root / t).read_bytes() for t in RUN_TARGETS + SWEEP_TARGETS}


def _argv(command: str, source: str, dest: str, force: bool) -> list[str]:
    if command == "eval":
        argv = ["eval", source, "--out", dest, "--episodes", "1"]
    elif command == "report":
        argv = ["report", source, "--out", dest]
    elif command == "replay":
        argv = ["replay", source, "--out", dest]
    else:
        argv = ["snapshot", source, dest]
    return argv + (["--force"] if force else [])


def _source(command: str, target: str) -> str:
    """What the command reads: the run (or sweep) that owns ``target``; replay reads a run."""
    if target.startswith("run/"):
        return "run"
    return f"sweep/runs/{SWEEP_RUN}" if command == "replay" else "sweep"


def _refused(argv: list[str], command: str, needle: str, root: Path, capsys) -> None:
    before = _bytes(root)
    rc = run_main(argv)
    assert_one_line_error(rc, capsys.readouterr().err, 2, command, [needle, "belongs to the"])
    assert _bytes(root) == before, f"{argv}: changed a file of the run or sweep"


@pytest.mark.parametrize("command", sorted(OWN_FILE))
@pytest.mark.parametrize("target", RUN_TARGETS + SWEEP_TARGETS)
def test_a_file_a_run_or_sweep_owns_is_refused_force_or_not(command, target, at_root,
                                                            capsys):
    parts = Path(target).parts
    owner = 2 if parts[0] == "run" or parts[1] != "runs" else 4  # the owner's path parts
    needle = parts[owner - 1] + ("/" if len(parts) > owner else "")  # e.g. wandb/
    link_dir = at_root / f"links-{command}-{target.replace('/', '_')}"
    link_dir.mkdir(exist_ok=True)
    link = link_dir / OWN_FILE[command]
    if not link.is_symlink():
        link.symlink_to(at_root / target)
    through = str(link.relative_to(at_root)) if command == "eval" \
        else str(link_dir.relative_to(at_root))
    for dest in (target, through):
        for force in FORCE[command]:
            _refused(_argv(command, _source(command, target), dest, force), command, needle,
                     at_root, capsys)


@pytest.mark.parametrize("command", sorted(OWN_FILE))
@pytest.mark.parametrize("dest", ["run/wandb", "sweep/runs", f"sweep/runs/{SWEEP_RUN}/wandb",
                                  "sweep/runs/new-run"])
def test_a_runs_wandb_and_a_sweeps_runs_folder_are_refused(command, dest, at_root, capsys):
    needle = "wandb/" if dest.endswith("wandb") else "runs/"
    for force in FORCE[command]:
        if command == "eval":  # a file there, or the videos
            _refused(_argv("eval", "run", f"{dest}/e.json", force), "eval", needle, at_root,
                     capsys)
            _refused(["eval", "run", "--video", dest, "--episodes", "1"], "eval", needle,
                     at_root, capsys)
        else:
            _refused(_argv(command, "run", dest, force), command, needle, at_root, capsys)
    assert not (at_root / "sweep/runs/new-run").exists()


def test_eval_keeps_its_own_files_and_force_replaces_only_them(at_root, capsys):
    owned = _owned(at_root)
    run = at_root / "run"
    for p in run.glob("eval*.json"):
        p.unlink()
    assert run_main(["eval", "run", "--episodes", "1"]) == 0  # run/eval.json, as ever
    assert run_main(["eval", "run", "--episodes", "1", "--seed", "7"]) == 0
    assert json.loads((run / "eval-2.json").read_text())["seed"] == 7  # never overwritten
    assert run_main(["eval", "run", "--episodes", "1", "--seed", "8", "--force"]) == 0
    assert json.loads((run / "eval.json").read_text())["seed"] == 8  # --force: its own file
    assert run_main(["eval", "run", "--episodes", "1", "--out", "e.json"]) == 0
    assert run_main(["eval", "run", "--episodes", "1", "--out", "e.json"]) == 2
    assert "exists; --force overwrites it" in capsys.readouterr().err
    assert run_main(["eval", "run", "--episodes", "1", "--out", "e.json", "--seed", "9",
                     "--force"]) == 0
    assert json.loads(Path("e.json").read_text())["seed"] == 9
    assert run_main(["eval", "sweep", "--episodes", "1"]) == 0  # each run's own eval file
    assert (at_root / "sweep/runs" / SWEEP_RUN / "eval.json").is_file()
    assert run_main(["eval", "sweep", "--episodes", "1", "--out", "sw.json", "--force"]) == 0
    capsys.readouterr()
    # the case: --force does not make the run's checkpoint eval's output
    _refused(["eval", "run", "--out", "run/checkpoint.pt", "--force"], "eval", "checkpoint.pt",
             at_root, capsys)
    _refused(["eval", "sweep", "--out", "sweep/index.json", "--force"], "eval", "index.json",
             at_root, capsys)
    assert _owned(at_root) == owned  # the run's and the sweep's files: untouched


def test_report_into_a_run_or_sweep_and_force_replace_only_its_own_files(at_root, capsys):
    owned = _owned(at_root)
    assert run_main(["report", "run", "--out", "run"]) == 0
    assert (at_root / "run/report.html").is_file()
    assert run_main(["report", "run", "--out", "run"]) == 2
    assert "holds an earlier report" in capsys.readouterr().err
    (at_root / "run/report.html").write_text("old")
    assert run_main(["report", "run", "--out", "run", "--force"]) == 0
    assert (at_root / "run/report.html").read_text() != "old"
    assert run_main(["report", "sweep", "--out", f"sweep/runs/{SWEEP_RUN}/report"]) == 0
    capsys.readouterr()
    _refused(["report", "run", "--out", "run/metrics.jsonl", "--force"], "report",
             "metrics.jsonl", at_root, capsys)
    assert _owned(at_root) == owned


def test_replay_into_a_run_and_force_replaces_only_its_own_files(at_root, capsys):
    owned = _owned(at_root)
    for n in ("replay.csv", "replay.png"):
        (at_root / "run" / n).unlink(missing_ok=True)
    assert run_main(["replay", "run", "--out", "run"]) == 0
    assert run_main(["replay", "run", "--out", "run"]) == 2
    assert "holds an earlier replay" in capsys.readouterr().err
    (at_root / "run/replay.csv").write_text("old")
    assert run_main(["replay", "run", "--out", "run", "--force"]) == 0
    assert (at_root / "run/replay.csv").read_text() != "old"
    capsys.readouterr()
    _refused(["replay", "run", "--out", "run/wandb", "--force"], "replay", "wandb/", at_root,
             capsys)
    assert _owned(at_root) == owned


def test_snapshot_into_a_run_or_sweep_writes_only_its_own_files(at_root, capsys):
    owned = _owned(at_root)
    # a report there (the report test's): a snapshot would replace part of it, so it refuses
    assert run_main(["report", "run", "--out", "run", "--force"]) == 0
    capsys.readouterr()
    assert run_main(["snapshot", "run", "run"]) == 2
    assert "holds a klppo report" in capsys.readouterr().err
    shutil.rmtree(at_root / "run/figures")
    for n in ("report.html", "final_returns.md", "final_returns.csv", "equivalence.md",
              "equivalence.csv", "aggregates.md", "trials.md"):
        (at_root / "run" / n).unlink(missing_ok=True)
    assert run_main(["snapshot", "run", "run"]) == 0
    assert run_main(["snapshot", "sweep", "sweep"]) == 0
    assert (at_root / "run/final_returns.md").is_file()
    assert (at_root / "sweep/report.html").is_file()
    capsys.readouterr()
    _refused(["snapshot", "sweep", "sweep/runs"], "snapshot", "runs/", at_root, capsys)
    assert _owned(at_root) == owned
