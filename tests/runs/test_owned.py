"""What a run, sweep or tuning study owns (issue #32, "Outputs are owned"):
:func:`klppo.runs.owned.owned_reason` refuses, in one line naming the flag, the value, the owner
and what the file is, a destination that would replace or create inside what a real (tiny) run
or sweep owns, after resolving links and ``..``; a command's own files in a run or sweep
directory stay allowed."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from klppo.runs.owned import RUN_OWNED, SWEEP_OWNED, owned_reason

#: the names a run trained with klppo.rl.train holds (tensorboard off)
TRAINED = ("config.yaml", "metadata.json", "status.json", "metrics.jsonl", "checkpoint.pt",
           "spaces.json", ".lock")
#: what a run holds only with TensorBoard, W&B or a sweep worker (made by hand here)
EXTRA = ("events.out.tfevents.1700000000.host.1.0", "wandb/run-1/files/output.log",
         "worker.log", ".checkpoint.pt.tmp123")


def tiny_run(out: Path) -> Path:
    """A real run: klip/cartpole, 1,024 steps, no TensorBoard."""
    from klppo import rl

    cfg = dataclasses.replace(rl.preset("klip/cartpole"), tensorboard=False, out=str(out),
                              total_steps=1024)
    return rl.train(cfg).run_dir


def tiny_sweep(out: Path) -> tuple[Path, Path]:
    """A real sweep of one run (as tests/experiments/test_sweep.py makes them); (the sweep,
    its run's directory)."""
    from klppo.experiments.sweep import SweepSpec, run_sweep

    spec = SweepSpec(preset="klip/cartpole", base={"total_steps": 1024, "tensorboard": False},
                     seeds=[0])
    res = run_sweep(spec, out, workers=1)
    assert [e.state for e in res.entries] == ["finished"]
    (run,) = sorted((out / "runs").iterdir())
    return out, run


def add_extra_files(run: Path) -> None:
    """The files of :data:`EXTRA` that ``run`` lacks (a byte each)."""
    for name in EXTRA:
        p = run / name
        if not p.exists():
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(b"x")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run = tiny_run(tmp_path_factory.mktemp("owned") / "run")
    add_extra_files(run)
    return run


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return tiny_sweep(tmp_path_factory.mktemp("owned") / "sweep")


def _refused(reason: str | None, *needles: str) -> None:
    assert reason is not None, "not refused"
    assert "\n" not in reason
    for n in needles:
        assert n in reason, f"{n!r} not in {reason!r}"


@pytest.mark.parametrize("name", TRAINED + EXTRA)
def test_every_file_a_run_owns_is_refused_as_a_file_or_a_directory(run, name):
    top = name.split("/")[0]
    assert (run / name).exists()
    for reason in (owned_reason(run / name), owned_reason(run / name, ["report.html"]),
                   owned_reason(run / name, what="dest")):
        _refused(reason, top, "belongs to the run in", str(run))
    _refused(owned_reason(run / name, what="dest"), "dest=")
    # ... and the same file named through a link and through '..'
    _refused(owned_reason(run / "eval-sub" / ".." / name), top)


def test_each_refusal_says_what_the_file_is_to_the_run(run):
    reason = owned_reason(run / "checkpoint.pt")
    assert reason == (f"--out={str(run / 'checkpoint.pt')!r}: checkpoint.pt belongs to the run "
                      f"in {run} (its checkpoint); choose a path outside the run directory")
    _refused(owned_reason(run / "metrics.jsonl"), "(its metrics)")
    _refused(owned_reason(run / "config.yaml"), "(its config)")
    _refused(owned_reason(run / ".checkpoint.pt.tmp123"), "(a temp file of its checkpoint)")
    # the other temp form, NAME.tmp (the metrics' rewrite on a resume)
    _refused(owned_reason(run / "metrics.jsonl.tmp"), "(a temp file of its metrics)")
    assert owned_reason(run / "policy.tmp") is None  # klppo never writes it: the user's
    _refused(owned_reason(run / "best" / "checkpoint.pt"), "(its best evaluated policy)")
    _refused(owned_reason(run / "wandb" / "new.json"), "wandb/ belongs to the run",
             "Weights & Biases")


def test_a_run_file_not_there_yet_is_owned_too(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "config.yaml").write_text("env: CartPole-v1\n")
    (tmp_path / "r" / "status.json").write_text("{}")
    for name in ("checkpoint.pt", "metrics.jsonl", "spaces.json", "wandb", "worker.log"):
        _refused(owned_reason(tmp_path / "r" / name), name)
        _refused(owned_reason(tmp_path / "r" / name, ["report.html"]), name)


def test_a_runs_own_files_and_other_commands_files_are_allowed(run):
    assert owned_reason(run / "eval.json") is None
    assert owned_reason(run / "eval-7.json") is None
    assert owned_reason(run, ["eval.json"]) is None
    assert owned_reason(run, ["report.html", "final_returns.md", "figures"]) is None
    assert owned_reason(run / "reports", ["report.html"]) is None
    # ... but not the run directory as a file, nor own names that are the run's
    _refused(owned_reason(run), "is the run directory", "itself")
    _refused(owned_reason(run, ["report.html", "metrics.jsonl"]), "metrics.jsonl")
    _refused(owned_reason(run, ["*.jsonl"]), "(its metrics)")


@pytest.mark.parametrize("name", ["spec.yaml", "index.json", ".lock", "runs"])
def test_every_file_a_sweep_owns_is_refused(sweep, name):
    sw, _ = sweep
    assert (sw / name).exists()
    shown = name + ("/" if name == "runs" else "")
    for reason in (owned_reason(sw / name), owned_reason(sw / name, ["report.html"])):
        _refused(reason, shown, "belongs to the sweep in", str(sw), SWEEP_OWNED[name])


@pytest.mark.parametrize("name", TRAINED + ("worker.log",))
def test_the_files_of_a_sweeps_run_are_the_runs(sweep, name):
    _, run = sweep
    assert (run / name).exists()
    _refused(owned_reason(run / name), name, f"belongs to the run in {run}")
    _refused(owned_reason(run / name, ["replay.csv"]), name, "belongs to the run in")


def test_inside_a_sweeps_runs_only_an_existing_run_directory_is_a_destination(sweep):
    sw, run = sweep
    assert owned_reason(run, ["report.html", "figures"]) is None
    assert owned_reason(run / "eval.json") is None
    for reason in (owned_reason(sw / "runs" / "new-run", ["report.html"]),
                   owned_reason(sw / "runs" / "eval.json"),
                   owned_reason(sw / "runs", ["report.html"])):
        _refused(reason, "runs/ belongs to the sweep in", "its runs' directories")
    _refused(owned_reason(sw / "runs" / run.name), "is the run directory")  # as a file
    assert owned_reason(sw, ["report.html", "figures"]) is None
    _refused(owned_reason(sw), "is the sweep directory")


def test_links_and_dotdot_are_resolved_before_deciding(run, sweep, tmp_path):
    sw, _ = sweep
    (tmp_path / "to-ckpt.json").symlink_to(run / "checkpoint.pt")
    (tmp_path / "to-run").symlink_to(run)
    (tmp_path / "to-wandb").symlink_to(run / "wandb")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "report.html").symlink_to(sw / "index.json")
    _refused(owned_reason(tmp_path / "to-ckpt.json"),
             f"(which leads to {run / 'checkpoint.pt'})", "checkpoint.pt belongs to the run",
             "does not lead into the run directory")
    _refused(owned_reason(tmp_path / "to-run" / "metrics.jsonl"), "metrics.jsonl")
    _refused(owned_reason(tmp_path / "to-wandb", ["report.html"]), "wandb/")
    _refused(owned_reason(tmp_path / "out", ["report.html", "figures"]),
             f"({tmp_path / 'out' / 'report.html'} leads to {sw / 'index.json'})",
             "index.json belongs to the sweep")
    _refused(owned_reason(Path(os.path.relpath(run / "status.json"))), "status.json")
    assert owned_reason(tmp_path / "to-run", ["report.html"]) is None
    assert owned_reason(tmp_path / "to-run" / "eval.json") is None


def test_a_tuning_study_and_an_rlhf_run_own_theirs(tmp_path):
    study = tmp_path / "study"
    (study / "runs" / "t0000__0").mkdir(parents=True)
    for name in ("tune.yaml", "study.journal", "index.json", "best_config.yaml"):
        (study / name).write_text("x")
    for name in ("tune.yaml", "study.journal", "index.json", "best_config.yaml", ".lock"):
        _refused(owned_reason(study / name), name, "belongs to the tuning study")
    _refused(owned_reason(study / "runs" / "t0000__0" / "config.yaml"), "belongs to the run")
    _refused(owned_reason(study / "runs" / "new", ["report.html"]), "runs/")
    assert owned_reason(study / "runs" / "t0000__0", ["eval.json"]) is None
    assert owned_reason(study, ["report.html"]) is None
    rlhf = tmp_path / "rlhf"
    (rlhf / "policy").mkdir(parents=True)
    (rlhf / "config.yaml").write_text("kind: rlhf\n")
    (rlhf / "metadata.json").write_text("{}")
    for name in ("policy", "policy/model.safetensors", ".policy.tmp", "checkpoint.pt",
                 "status.json", "metrics.jsonl"):
        _refused(owned_reason(rlhf / name), name.split("/")[0], "belongs to the run")
    assert owned_reason(rlhf / "eval.json") is None


def test_a_directory_that_is_not_a_run_owns_nothing(tmp_path):
    """config.yaml alone (a user's folder) is no run; a folder named runs/ beside no spec is
    no sweep's."""
    (tmp_path / "config.yaml").write_text("x")
    (tmp_path / "runs").mkdir()
    assert owned_reason(tmp_path / "config.yaml") is None
    assert owned_reason(tmp_path / "runs", ["report.html"]) is None
    assert set(RUN_OWNED) >= {"config.yaml", "checkpoint.pt", "metrics.jsonl", "wandb"}
    (tmp_path / "metrics.jsonl").write_text("")  # now a run lives there
    _refused(owned_reason(tmp_path / "config.yaml"), "config.yaml belongs to the run")
    (tmp_path / "spec.yaml").write_text("x")  # and a sweep beside it: runs/ is the runs'
    (tmp_path / "config.yaml").unlink()
    _refused(owned_reason(tmp_path / "runs", ["report.html"]), "runs/ belongs to the sweep")
