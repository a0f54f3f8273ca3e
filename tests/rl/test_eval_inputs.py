"""Bad input to `klppo eval`: a checkpoint that does not fit its run (another run's, a forged
one) and an eval.json that cannot be written are one line on stderr naming the file and the
mismatch, exit status 2, no traceback, and nothing written."""

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from klppo import rl
from tests.badinput import assert_one_line_error, run_main, tree

ROOT = Path(__file__).resolve().parents[2]


def _train(out: Path, **kw) -> Path:
    cfg = rl.preset("klip/cartpole")
    net = dataclasses.replace(cfg.net, **kw.pop("net", {}))
    cfg = dataclasses.replace(cfg, tensorboard=False, out=str(out), total_steps=1024, net=net,
                              **kw)
    return rl.train(cfg).run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval_runs")
    return {"base": _train(root / "base"),
            "hidden32": _train(root / "h32", net={"hidden": (32, 32)}),
            "acrobot": _train(root / "acro", env="Acrobot-v1")}


def _edit(fn):
    """A damage that rewrites the run's checkpoint state with ``fn(state)``."""
    def damage(run: Path, runs: dict) -> None:
        path = run / "checkpoint.pt"
        state = torch.load(path, map_location="cpu", weights_only=False)
        torch.save(fn(state), path)
    return damage


def _copy_from(name: str):
    def damage(run: Path, runs: dict) -> None:
        shutil.copy(runs[name] / "checkpoint.pt", run / "checkpoint.pt")
    return damage


def _agent(fn):
    return _edit(lambda s: {**s, "agent": fn(dict(s["agent"]))})


def _nothing(run: Path, runs: dict) -> None:
    pass


#: (id, damage, extra flags, needles of the one line)
CASES = [
    ("another-runs-hidden", _copy_from("hidden32"), [],
     ["checkpoint.pt", "does not fit the run's config.yaml", "net.hidden [64, 64]",
      "actor.0.weight is [32, 4] in the checkpoint, [64, 4] in the network"]),
    ("another-runs-env", _copy_from("acrobot"), [],
     ["checkpoint.pt", "spaces.json", "env CartPole-v1", "network takes 6"]),
    ("parameter-missing", _agent(lambda a: {k: v for k, v in a.items()
                                            if k != "critic.0.bias"}), [],
     ["checkpoint.pt", "parameters missing ['critic.0.bias']"]),
    ("parameter-unexpected", _agent(lambda a: {**a, "extra.weight": torch.zeros(2)}), [],
     ["checkpoint.pt", "unexpected ['extra.weight']"]),
    ("parameter-not-a-tensor", _agent(lambda a: {**a, "actor.0.weight": "x"}), [],
     ["checkpoint.pt", "actor.0.weight is str in the checkpoint"]),
    ("agent-not-a-mapping", _edit(lambda s: {**s, "agent": 3}), [],
     ["checkpoint.pt", "holds no network weights"]),
    ("state-a-list", _edit(lambda s: [1, 2]), [], ["checkpoint.pt"]),
    ("obs-norm-shape", _edit(lambda s: {**s, "obs_norm": {"mean": [0.0] * 7, "var": [1.0] * 7,
                                                          "count": 1.0}}), [],
     ["checkpoint.pt", "observation normaliser has shape [7]", "4 values"]),
    ("obs-norm-broken", _edit(lambda s: {**s, "obs_norm": {"mean": [0.0] * 4}}), [],
     ["checkpoint.pt", "observation normaliser cannot be read", "KeyError"]),
    # where eval.json goes
    ("eval-json-a-directory-forced", lambda run, runs: (run / "eval.json").mkdir(), ["--force"],
     ["eval.json=", "eval.json'", "is a directory"]),
    ("out-exists", _nothing, ["--out", "{tmp}/file"],
     ["out=", "file'", "exists; --force overwrites it"]),
    ("run-on-a-run-directory", _nothing, ["--run", "x"], ["--run x: only for a sweep directory"]),
    ("out-a-directory", _nothing, ["--out", "{tmp}"], ["out=", "is a directory"]),
    ("out-in-a-missing-directory", _nothing, ["--out", "{tmp}/no/e.json"],
     ["out=", "e.json", "is not a directory"]),
    ("out-under-a-file", _nothing, ["--out", "{tmp}/file/e.json"],
     ["out=", "is not a directory"]),
    ("video-under-a-file", _nothing, ["--video", "{tmp}/file/v"], ["--video=", "is a file"]),
    ("video-empty", _nothing, ["--video", ""], ["argument --video: '' names no path"]),
    ("out-empty", _nothing, ["--out", ""], ["argument --out: '' names no path"]),
    ("episodes-zero", _nothing, ["--episodes", "0"], ["--episodes: 0 is not in [1, 100,000]"]),
    ("episodes-huge", _nothing, ["--episodes", "1000000000"], ["--episodes: 1000000000"]),
    ("seed-beyond-64-bits", _nothing, ["--seed", str(2**64)], ["--seed: 18446744073709551616"]),
    ("weights-nan", _agent(lambda a: {**a, "actor.0.weight": a["actor.0.weight"] * float("nan")}),
     [], ["checkpoint.pt", "actor.0.weight holds a non-finite value"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_eval_bad_input(case, runs, tmp_path, capsys):
    _, damage, flags, needles = case
    run = tmp_path / "run"
    shutil.copytree(runs["base"], run)
    (tmp_path / "file").write_text("x")
    damage(run, runs)
    before = tree(tmp_path)
    argv = [a.format(tmp=tmp_path) for a in flags]
    rc = run_main(["eval", str(run), "--episodes", "1", *argv])
    assert_one_line_error(rc, capsys.readouterr().err, 2, "eval", needles)
    assert tree(tmp_path) == before, "a refused eval must write nothing"


def test_a_read_only_run_directory_is_one_line_and_out_writes_elsewhere(runs, tmp_path, capsys,
                                                                        monkeypatch):
    """(os.access stands in for a read-only directory: root may write anywhere.)"""
    run = tmp_path / "run"
    shutil.copytree(runs["base"], run)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == run
                        else real(p, mode))
    rc = run_main(["eval", str(run), "--episodes", "1"])
    assert_one_line_error(rc, capsys.readouterr().err, 2, "eval",
                          [f"eval.json={str(run / 'eval.json')!r}", "is not writable",
                           "--out FILE"])
    assert not (run / "eval.json").exists()
    assert run_main(["eval", str(run), "--episodes", "1", "--out", str(tmp_path / "e.json")]) == 0
    assert f"written: {tmp_path / 'e.json'}" in capsys.readouterr().out
    assert (tmp_path / "e.json").exists() and not (run / "eval.json").exists()


def test_another_runs_checkpoint_is_one_line_in_a_real_process(runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs["base"], run)
    _copy_from("hidden32")(run, runs)
    proc = subprocess.run([sys.executable, "-m", "klppo", "eval", str(run), "--episodes", "1"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert_one_line_error(proc.returncode, proc.stderr, 2, "eval",
                          ["actor.0.weight is [32, 4] in the checkpoint"])
    assert not (run / "eval.json").exists()
