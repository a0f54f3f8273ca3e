"""What the LM side's commands own and refuse, as `klppo train` does: a new run's `--out` must be
new or empty and outside what a run owns, a pretrained model is never replaced, a resume checks
the model and the checkpoint's iteration, a damaged comparison arm fails with its files kept."""

import hashlib
import json
import pickle
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from klppo.lm.config import RLHFConfig  # noqa: E402
from klppo.lm.rlhf import ResumeError, resume_rlhf, rlhf  # noqa: E402
from tests.badinput import assert_one_line_error, run_main, tree  # noqa: E402
from tests.lm.conftest import TINY, make_tiny_model  # noqa: E402

SMALL = {**TINY, "iterations": 2, "checkpoint_every": 1}


def cfg(model, out, **kw):
    return RLHFConfig(model=str(model), out=str(out), **{**SMALL, **kw})


def md5(p: Path) -> str:
    return hashlib.md5(p.read_bytes()).hexdigest()


# --------------------------------------------------------------- a new run's --out
@pytest.mark.parametrize("files", [
    {"policy/notes.txt": "precious"},  # a user's folder that the run's export would replace
    {"status.json": "mine", "metrics.jsonl.tmp": "precious"},
    {"config.yaml": "kind: rlhf\n", "metadata.json": "{}"},  # a run killed before its metrics
])
def test_rlhf_refuses_an_out_that_is_not_new_or_empty(files, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "out"
    for name, text in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    before = {n: (out / n).read_text() for n in files}
    rc = run_main(["rlhf", "--model", str(tiny_model_dir), "--out", str(out),
                   "--iterations", "1"])
    assert_one_line_error(rc, capsys.readouterr().err, 2, "rlhf", [f"out={str(out)!r}"])
    assert {n: (out / n).read_text() for n in files} == before
    assert tree(out) <= {*files} | {str(Path(n).parent) for n in files}  # nothing made


def test_an_arm_keeps_its_own_pending_file(tiny_model_dir, tmp_path):
    out = tmp_path / "arm"
    out.mkdir()
    (out / "pending.yaml").write_text("x: 1\n")
    with pytest.raises(Exception, match="not empty"):
        rlhf(cfg(tiny_model_dir, out))
    res = rlhf(cfg(tiny_model_dir, out), keep=("pending.yaml",))
    assert res.status == "finished"


@pytest.mark.parametrize("command", [
    ["train", "--env", "CartPole-v1", "--total-steps", "512"],
    ["rlhf", "--iterations", "1"],
    ["rlhf", "compare", "--iterations", "1"],
])
@pytest.mark.parametrize("inside", ["policy", "wandb", "best"])
def test_out_inside_what_a_run_owns_is_refused(command, inside, tiny_model_dir, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("kind: rlhf\n")
    (run / "metrics.jsonl").write_text("")
    before = tree(run)
    model = [] if command[0] == "train" else ["--model", str(tiny_model_dir)]
    rc = run_main([*command, *model, "--out", str(run / inside)])
    name = "rlhf compare" if command[:2] == ["rlhf", "compare"] else command[0]
    assert_one_line_error(rc, capsys.readouterr().err, 2, name, [f"{inside}", "belongs to the run"])
    assert tree(run) == before


# --------------------------------------------------------------- lm pretrain
def test_pretrain_never_replaces_a_model(tmp_path, capsys):
    from klppo.lm.pretrain_config import PretrainConfig, validate_pretrain

    out = tmp_path / "base"
    make_tiny_model(out)
    before = {p.name: md5(p) for p in out.iterdir()}
    rc = run_main(["lm", "pretrain", "--out", str(out), "--steps", "1", "--seed", "1"])
    assert_one_line_error(rc, capsys.readouterr().err, 2, "lm pretrain",
                          [f"out={str(out)!r}", "not empty"])
    assert {p.name: md5(p) for p in out.iterdir()} == before
    (tmp_path / "empty").mkdir()
    validate_pretrain(PretrainConfig(out=str(tmp_path / "empty")))  # new or empty: fine
    validate_pretrain(PretrainConfig(out=str(tmp_path / "new")))


def test_pretrain_refuses_a_blank_out(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc = run_main(["lm", "pretrain", "--out", "", "--steps", "1"])
    assert_one_line_error(rc, capsys.readouterr().err, 2, "lm pretrain", ["out=''"])
    assert tree(tmp_path) == set()


# --------------------------------------------------------------- resume
@pytest.mark.parametrize("started_with", [None, "4.0.0"])
def test_a_resume_refuses_a_model_that_changed(started_with, tmp_path):
    # started_with: the transformers version metadata.json says the run started with (None:
    # this one); a new version may read the same file into other weights, and the refusal says so
    model = make_tiny_model(tmp_path / "model")
    out = tmp_path / "run"
    rlhf(cfg(model, out, iterations=1))
    meta = json.loads((out / "metadata.json").read_text())
    assert len(meta["model_sha256"]) == 64
    if started_with is not None:
        meta["packages"]["transformers"] = started_with
        (out / "metadata.json").write_text(json.dumps(meta))
    (out / "config.yaml").write_text((out / "config.yaml").read_text()
                                     .replace("iterations: 1", "iterations: 2"))
    ckpt = torch.load(out / "checkpoint.pt", weights_only=True)  # the run, now of 2 iterations
    ckpt["config"]["iterations"] = 2
    torch.save(ckpt, out / "checkpoint.pt")
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(model)
    with torch.no_grad():
        next(lm.parameters())[0, 0] += 1e-3  # one weight moved: another model
    lm.save_pretrained(model)
    before = md5(out / "checkpoint.pt")
    with pytest.raises(ResumeError, match=r"model=.*is not the model this run started from") as e:
        resume_rlhf(out)
    assert ("transformers was 4.0.0 at the start" in str(e.value)) == (started_with is not None)
    assert md5(out / "checkpoint.pt") == before
    assert "not the model" in json.loads((out / "status.json").read_text())["error"]


@pytest.mark.parametrize("iteration", [10**12, -3, True, 8.5, 3])
def test_a_checkpoint_iteration_out_of_range_is_refused(iteration, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    rlhf(cfg(tiny_model_dir, out))
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    state["iteration"] = iteration  # 3: beyond the run's 2 iterations
    torch.save(state, out / "checkpoint.pt")
    with pytest.raises(ResumeError, match=r"iteration=.* must be an integer from 0 to"):
        resume_rlhf(out)
    assert "iteration=" in json.loads((out / "status.json").read_text())["error"]


def test_a_pickled_checkpoint_is_refused_without_torch_s_warning(tmp_path, capsys):
    class Code:
        def __reduce__(self):
            return (print, ("ran",))

    path = tmp_path / "checkpoint.pt"
    path.write_bytes(pickle.dumps({"iteration": 1, "x": Code()}, protocol=4))
    from klppo.lm.rlhf import read_checkpoint

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's UserWarning on the protocol would raise here
        with pytest.raises(ResumeError, match="checkpoint="):
            read_checkpoint(path)
    assert "ran" not in capsys.readouterr().out


# --------------------------------------------------------------- compare
def test_compare_bounds_the_seeds_before_any_work(tiny_model_dir, tmp_path, capsys):
    seeds = [str(s) for s in range(2501)]
    rc = run_main(["rlhf", "compare", "--model", str(tiny_model_dir), "--out",
                   str(tmp_path / "cmp"), "--seeds", *seeds])
    assert_one_line_error(rc, capsys.readouterr().err, 2, "rlhf compare",
                          ["--seeds", "10,004 arms", "at most 10,000"])
    assert tree(tmp_path) == set()


def test_a_damaged_arm_fails_with_its_checkpoint_kept(tiny_model_dir, tmp_path):
    from klppo.experiments.rlhf_compare import arms, run_compare

    base = RLHFConfig(model=str(tiny_model_dir), **SMALL)
    configs = {k: v for k, v in arms(base, 0.5, 0.01, "step", [0]).items() if k == "fixed_weak__0"}
    assert run_compare(configs, tmp_path / "cmp", workers=1) == {
        "fixed_weak__0": ("finished", None)}
    arm = tmp_path / "cmp" / "runs" / "fixed_weak__0"
    lines = (arm / "metrics.jsonl").read_text().splitlines(keepends=True)
    (arm / "metrics.jsonl").write_text("".join(lines[1:]))  # iteration 1's line lost
    status = json.loads((arm / "status.json").read_text())
    (arm / "status.json").write_text(json.dumps({**status, "state": "failed"}))
    before = md5(arm / "checkpoint.pt")
    state, error = run_compare(configs, tmp_path / "cmp", workers=1)["fixed_weak__0"]
    assert state == "failed" and "metrics.jsonl" in error, (state, error)
    assert md5(arm / "checkpoint.pt") == before


def test_a_config_field_given_with_both_spellings_is_refused():
    from klppo.runs.configfile import TypeCheckError, overlay

    with pytest.raises(TypeCheckError, match="batch_size is given twice"):
        overlay(RLHFConfig(), {"batch_size": 4, "batch-size": 8})


# --------------------------------------------------------------- an arm that starts again
def _arm(model: Path, root: Path) -> Path:
    import dataclasses

    from klppo.experiments.rlhf_worker import PENDING
    from klppo.runs import rundir as R

    arm = root / "cmp" / "runs" / "fixed_weak__0"
    arm.mkdir(parents=True)
    R.write_yaml(arm / PENDING, dataclasses.asdict(cfg(model, arm, iterations=1)))
    (arm / "worker.log").write_text("")
    return arm


@pytest.mark.parametrize("left", ["interrupted_status", "pending_temp"])
def test_an_arm_stopped_before_its_config_starts_again(left, tiny_model_dir, tmp_path):
    from klppo.experiments.rlhf_worker import run_arm
    from klppo.runs import rundir as R

    arm = _arm(tiny_model_dir, tmp_path)
    if left == "interrupted_status":  # the launcher's record of a worker stopped while loading
        R.write_status(arm, "interrupted", error="worker stopped")  # (with .status.reserve)
    else:  # a compare killed while it rewrote pending.yaml
        (arm / ".pending.yaml.tmp4242").write_text("x: ")
    run_arm(arm)
    assert json.loads((arm / "status.json").read_text())["state"] == "finished"


def test_an_arm_continues_when_the_comparison_is_named_another_way(tiny_model_dir, tmp_path,
                                                                  monkeypatch):
    from klppo.experiments.rlhf_compare import arms, run_compare

    monkeypatch.chdir(tmp_path)
    base = RLHFConfig(model=str(tiny_model_dir), **SMALL)
    configs = {k: v for k, v in arms(base, 0.5, 0.01, "step", [0]).items() if k == "fixed_weak__0"}
    assert run_compare(configs, "cmp", workers=1)["fixed_weak__0"][0] == "finished"
    arm = tmp_path / "cmp" / "runs" / "fixed_weak__0"
    status = json.loads((arm / "status.json").read_text())
    (arm / "status.json").write_text(json.dumps({**status, "state": "interrupted"}))
    before = (md5(arm / "checkpoint.pt"), (arm / "metrics.jsonl").read_text())
    res = run_compare(configs, str(tmp_path / "cmp"), workers=1)  # --out spelled absolutely
    assert res["fixed_weak__0"] == ("finished", None), res
    assert (md5(arm / "checkpoint.pt"), (arm / "metrics.jsonl").read_text()) == before


def test_a_refused_resume_keeps_the_run_s_iteration_in_its_status(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    rlhf(cfg(tiny_model_dir, out))
    (out / "checkpoint.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ResumeError):
        resume_rlhf(out)
    status = json.loads((out / "status.json").read_text())
    assert status["state"] == "failed" and status["iteration"] == 2  # was 0
    assert status["checkpoint_iteration"] == 2
