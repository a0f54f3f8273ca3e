"""What a training run's directory keeps and refuses beyond its own files: a refused extension
writes nothing, a user's file that merely looks like a temp file is never taken or deleted, an
edited config.yaml is not what eval or load build, a forged checkpoint fails only its own run
in a group, and the resume line names the checkpoint's iteration."""

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch

import klppo.rl as rl
from tests.badinput import assert_one_line_error, run_main, tree


def _small(out: Path, **kw) -> rl.TrainConfig:
    c = rl.preset("klip/cartpole")
    return dataclasses.replace(c, out=str(out), total_steps=2048, tensorboard=False,
                               checkpoint_every=1, **kw)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "base"
    rl.train(_small(out))
    return out


def _copy(base: Path, to: Path) -> Path:
    shutil.copytree(base, to)
    return to


def _forge(run: Path, *keys: str, value) -> None:
    state = torch.load(run / "checkpoint.pt", weights_only=False)
    node = state
    for k in keys[:-1]:
        node = node[k]
    node[keys[-1]] = value
    torch.save(state, run / "checkpoint.pt")


def test_a_refused_extension_writes_nothing(base, tmp_path, capsys):
    run = _copy(base, tmp_path / "r")
    _forge(run, "optimizer", "t", value=-1)
    before = {n: (run / n).read_bytes() for n in ("config.yaml", "checkpoint.pt", "metadata.json")}
    assert run_main(["train", "--resume", str(run), "--total-steps", "4096"]) == 2
    assert "optimizer.t=-1" in capsys.readouterr().err
    assert {n: (run / n).read_bytes() for n in before} == before


@pytest.mark.parametrize("name", [".notes.tmp.txt", ".cache.tmp", "x.tmp"])
def test_a_users_file_that_looks_like_a_temp_file_is_never_taken(name, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_text("precious")
    assert run_main(["train", "--env", "CartPole-v1", "--total-steps", "512", "--out",
                     str(out)]) == 2
    assert_one_line_error(2, capsys.readouterr().err, 2, "train", ["not empty", name])
    assert tree(out) == {name}


def test_a_resume_removes_only_the_temp_files_of_its_own_writes(base, tmp_path):
    run = _copy(base, tmp_path / "r")
    (run / ".cache.tmp").mkdir()  # a directory whose name looks like a temp file's
    (run / ".notes.tmp.txt").write_text("precious")
    (run / "policy.tmp").write_text("precious")  # klppo never writes policy.tmp
    (run / ".status.json.tmp123").write_text("{")  # a killed write's temp file
    (run / "metrics.jsonl.tmp").write_text("{")
    assert rl.resume(run, total_steps=4096).status == "finished"
    assert (run / ".cache.tmp").is_dir() and (run / ".notes.tmp.txt").read_text() == "precious"
    assert (run / "policy.tmp").read_text() == "precious"
    assert not (run / ".status.json.tmp123").exists()
    assert not (run / "metrics.jsonl.tmp").exists()


@pytest.mark.parametrize("reader", ["eval", "load"])
def test_an_edited_env_in_config_yaml_is_not_built(reader, base, tmp_path, capsys,
                                                   monkeypatch):
    run = _copy(base, tmp_path / "r")
    (tmp_path / "sideeffect.py").write_text(
        "import pathlib\npathlib.Path(__file__).with_name('RAN').write_text('x')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    text = (run / "config.yaml").read_text().replace("env: CartPole-v1",
                                                     "env: sideeffect:CartPole-v1")
    (run / "config.yaml").write_text(text)
    if reader == "eval":
        rc = run_main(["eval", str(run), "--episodes", "1"])
        assert_one_line_error(rc, capsys.readouterr().err, 2, "eval",
                              ["env='sideeffect:CartPole-v1'", "made for env='CartPole-v1'"])
    else:
        import klppo

        with pytest.raises(Exception, match="made for env="):
            klppo.load(run)
    assert not (tmp_path / "RAN").exists()


def test_a_forged_checkpoint_fails_only_its_own_run_in_a_group(base, tmp_path):
    from klppo.rl.engine.rundirs import train_group

    bad, good = _copy(base, tmp_path / "bad"), _copy(base, tmp_path / "good")
    for run in (bad, good):  # both to be continued (to a new total) in one group
        rl.resume(run, total_steps=2560)
    _forge(bad, "optimizer", "t", value=10**30)
    for run in (bad, good):
        status = json.loads((run / "status.json").read_text())
        (run / "status.json").write_text(json.dumps({**status, "state": "interrupted"}))
    res = train_group([bad, good])
    assert res[0].status == "failed" and res[1].status == "finished", res
    assert "OverflowError" in json.loads((bad / "status.json").read_text())["error"]
    assert json.loads((good / "status.json").read_text()).get("error") is None


def test_the_resume_line_names_the_checkpoints_iteration(base, tmp_path, capsys):
    run = _copy(base, tmp_path / "r")
    status = json.loads((run / "status.json").read_text())  # as a killed run's: its start
    (run / "status.json").write_text(json.dumps({**status, "state": "running",
                                                 "checkpoint_iteration": 0}))
    assert run_main(["train", "--resume", str(run), "--total-steps", "2560"]) == 0
    assert "resuming" in (out := capsys.readouterr().out) and "from iteration 4 of 5" in out, out


def test_snapshot_bounds_smooth_and_never_replaces_a_report(base, tmp_path, capsys):
    rc = run_main(["snapshot", str(base), str(tmp_path / "s"), "--smooth", str(10**19)])
    assert_one_line_error(rc, capsys.readouterr().err, 2, "snapshot", ["--smooth="])
    assert not (tmp_path / "s").exists()
    assert run_main(["report", str(base), "--out", str(tmp_path / "rep")]) == 0
    before = {p: p.read_bytes() for p in (tmp_path / "rep").rglob("*") if p.is_file()}
    capsys.readouterr()
    rc = run_main(["snapshot", str(base), str(tmp_path / "rep")])
    assert_one_line_error(rc, capsys.readouterr().err, 2, "snapshot", ["holds a klppo report"])
    assert {p: p.read_bytes() for p in (tmp_path / "rep").rglob("*") if p.is_file()} == before
    assert run_main(["snapshot", str(base), str(tmp_path / "snap")]) == 0
    assert run_main(["snapshot", str(base), str(tmp_path / "snap")]) == 0  # its own: again


def test_a_new_run_inside_another_run_s_directory_is_refused(base, tmp_path, capsys):
    run = _copy(base, tmp_path / "r")
    before = tree(run)
    assert run_main(["train", "--env", "CartPole-v1", "--total-steps", "512", "--out",
                     str(run / "sub")]) == 2
    assert_one_line_error(2, capsys.readouterr().err, 2, "train",
                          ["lies inside the run in", "outside the run directory"])
    assert tree(run) == before


def test_a_project_folder_with_a_config_and_metadata_of_its_own_is_no_run(tmp_path, capsys,
                                                                          monkeypatch):
    # a user's project root may hold config.yaml and metadata.json: runs below it are made
    (tmp_path / "config.yaml").write_text("lr: 0.1\n")
    (tmp_path / "metadata.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert run_main(["train", "--env", "CartPole-v1", "--total-steps", "512", "--out",
                     "runs/a"]) == 0
    assert (tmp_path / "runs" / "a" / "checkpoint.pt").is_file()
