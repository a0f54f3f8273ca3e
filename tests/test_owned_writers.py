"""Outputs are owned (issue #32), for the writers that make their own directory or file:
``klppo sweep`` and ``klppo tune`` (which own the directory they write) and
``Policy.export``. Each refuses, before any work and in one line naming the file and its owner,
a destination where it would replace or create inside what a real (tiny) run, sweep or study
owns; the owner's bytes stay untouched. A sweep or study directory stays a fine destination for
the same command (it continues there), and a fresh folder beside a run is fine."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import klppo
from klppo.runs.errors import InputError
from tests.badinput import assert_one_line_error, run_main
from tests.runs.test_owned import tiny_run, tiny_sweep

SWEEP_RUN = "CartPole-v1__base__0"
SPEC = {"preset": "klip/cartpole", "base": {"total_steps": 1024, "tensorboard": False},
        "seeds": [0]}
TUNE = {"preset": "klip/cartpole", "base": {"total_steps": 1024, "tensorboard": False},
        "space": {"ppo.lr": {"low": 1e-4, "high": 3e-3, "log": True}}, "trials": 1}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("owned_writers")
    tiny_run(root / "run")
    tiny_sweep(root / "sweep")
    (root / "spec.yaml").write_text(yaml.safe_dump(SPEC))
    (root / "tune.yaml").write_text(yaml.safe_dump(TUNE))
    return root


@pytest.fixture
def at_root(root, monkeypatch):
    monkeypatch.chdir(root)
    return root


def _bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for top in ("run", "sweep")
            for p in sorted((root / top).rglob("*")) if p.is_file()}


#: destination -> words of the refusal (the owner and what the path is to it)
SWEEP_DESTS = {
    "run": ".lock belongs to the run in run (its lock)",
    f"sweep/runs/{SWEEP_RUN}": f".lock belongs to the run in sweep/runs/{SWEEP_RUN}",
    "sweep/runs/new": "runs/ belongs to the sweep in sweep",
    "run/wandb/sub": "wandb/ belongs to the run in run",
    "run/checkpoint.pt": "checkpoint.pt belongs to the run in run",
}


@pytest.mark.parametrize("dest", list(SWEEP_DESTS))
@pytest.mark.parametrize("command", ["sweep", "tune"])
def test_sweep_and_tune_refuse_a_directory_a_run_or_sweep_owns(at_root, command, dest, capsys):
    if command == "tune":
        pytest.importorskip("optuna")
    before = _bytes(at_root)
    argv = [command, "--spec", f"{command if command == 'tune' else 'spec'}.yaml", "--out", dest]
    if command == "sweep":
        argv += ["--workers", "1"]
    code = run_main(argv)
    err = capsys.readouterr().err
    assert_one_line_error(code, err, 2, command, [f"out={dest!r}", SWEEP_DESTS[dest]])
    assert _bytes(at_root) == before


def test_a_sweep_reopens_its_own_directory(at_root, capsys):
    """The sweep's own directory is its earlier output: the same spec continues there (every
    run already finished)."""
    (at_root / "same.yaml").write_text(yaml.safe_dump(
        {"preset": "klip/cartpole", "base": {"total_steps": 1024, "tensorboard": False},
         "seeds": [0]}))
    before = (at_root / "sweep" / "runs" / SWEEP_RUN / "checkpoint.pt").read_bytes()
    code = run_main(["sweep", "--spec", "same.yaml", "--out", "sweep", "--workers", "1"])
    assert code == 0, capsys.readouterr().err
    assert (at_root / "sweep" / "runs" / SWEEP_RUN / "checkpoint.pt").read_bytes() == before


def test_export_refuses_a_file_a_run_owns(at_root):
    policy = klppo.load(at_root / "run")
    before = _bytes(at_root)
    for name in ["checkpoint.pt", "metrics.jsonl", "config.yaml", "spaces.json"]:
        with pytest.raises(InputError) as e:
            policy.export(at_root / "run" / name)
        assert "\n" not in str(e.value) and f"{name} belongs to the run" in str(e.value)
    with pytest.raises(InputError, match="belongs to the sweep"):
        policy.export(at_root / "sweep" / "index.json")
    assert _bytes(at_root) == before
    out = policy.export(at_root / "run" / "policy.pt2")  # a file of its own in the run: fine
    assert out.is_file()
    out.unlink()
