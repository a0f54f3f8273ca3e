import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from klppo.cli import main
from klppo.rl.trainer import TIMING_KEYS
from klppo.runs.metrics import read_metrics
from klppo.runs.sweep import SweepSpec, expand, run_sweep
from tests.waiting import wait_for_lines

ROOT = Path(__file__).resolve().parents[2]
BASE = {"total_steps": 1024, "tensorboard": False}


def spec(**kw):
    d = dict(preset="klip/cartpole", base=dict(BASE), seeds=[0])
    d.update(kw)
    return SweepSpec(**d)


def metrics(run_dir):
    recs, _ = read_metrics(Path(run_dir) / "metrics.jsonl")
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in recs]


def test_expand_grid_conditions_seeds():
    s = SweepSpec(preset="klip/cartpole", base={"total_steps": 2048},
                  conditions={"clip": {"objective": "clip"},
                              "kl": {"objective": "kl_penalty", "kl.controller": "step"}},
                  grid={"ppo.lr": [1e-3, 3e-4]}, seeds=[0, 1])
    runs = expand(s)
    assert len(runs) == 2 * 2 * 2
    names = [e.name for e, _ in runs]
    assert "CartPole-v1__kl__lr=0.001__1" in names
    cfg = dict((e.name, c) for e, c in runs)["CartPole-v1__kl__lr=0.001__1"]
    assert (cfg.objective, cfg.kl.controller, cfg.ppo.lr, cfg.seed, cfg.total_steps) == (
        "kl_penalty", "step", 1e-3, 1, 2048)


def test_crash_isolation_and_summary(tmp_path, capsys):
    env_mod = "tests.rl.envs_for_tests"
    s = spec(conditions={
        "good": {"objective": "clip"},
        "nan": {"env": f"{env_mod}:KlppoTest/NaN-v0",
                "rollout": {"vectorization": "sync", "num_envs": 1}},
        "segv": {"env": f"{env_mod}:KlppoTest/Crash-v0", "rollout": {"vectorization": "sync"}},
    }, base={**BASE, "total_steps": 4096})
    res = run_sweep(s, tmp_path / "sw", workers=2)
    state = {e.condition: e for e in res.entries}
    assert state["good"].state == "finished"
    assert state["nan"].state == "failed" and "non-finite" in state["nan"].error
    assert state["segv"].state == "failed" and "exited with code 3" in state["segv"].error
    assert all(e.wall_s is not None and e.wall_s > 0 for e in res.entries)
    index = json.loads((tmp_path / "sw" / "index.json").read_text())
    assert {r["condition"]: r["state"] for r in index["runs"]} == {
        "good": "finished", "nan": "failed", "segv": "failed"}
    st = json.loads((tmp_path / "sw" / "runs" / state["segv"].name / "status.json").read_text())
    assert st["state"] == "failed" and st["traceback"] is not None
    # the CLI reports the failures and exits non-zero; finished runs are not rerun
    before = (tmp_path / "sw" / "runs" / state["good"].name / "metrics.jsonl").stat().st_mtime
    spec_file = tmp_path / "spec.yaml"
    import dataclasses

    import yaml

    spec_file.write_text(yaml.safe_dump(dataclasses.asdict(s)))
    assert main(["sweep", "--spec", str(spec_file), "--out", str(tmp_path / "sw"),
                 "--workers", "2"]) == 1
    out = capsys.readouterr().out
    assert "1 finished, 2 failed" in out and "FAILED" in out
    assert not any(state["good"].name in ln for ln in out.splitlines()
                   if ln.startswith("["))  # finished before: not rerun
    nan_line = next(ln for ln in out.splitlines() if ln.startswith("[") and "NaN" in ln)
    assert re.search(r"\(\d+ s, sweep at \d+ s\)$", nan_line)  # its own time, then the sweep's
    after = (tmp_path / "sw" / "runs" / state["good"].name / "metrics.jsonl").stat().st_mtime
    assert before == after


def test_killed_sweep_resumes_and_matches_a_clean_sweep(tmp_path):
    s = spec(conditions={"clip": {"objective": "clip"}}, seeds=[0, 1],
             base={**BASE, "total_steps": 6144, "checkpoint_every": 1})
    clean = run_sweep(s, tmp_path / "clean", workers=2)
    assert not clean.failed
    import dataclasses

    import yaml

    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(dataclasses.asdict(s)))
    proc = subprocess.Popen([sys.executable, "-m", "klppo.cli", "sweep", "--spec", str(spec_file),
                             "--out", str(tmp_path / "killed"), "--workers", "1"], cwd=ROOT,
                            start_new_session=True, stdout=subprocess.DEVNULL)
    first = tmp_path / "killed" / "runs" / "CartPole-v1__clip__0" / "metrics.jsonl"
    wait_for_lines(first, 4)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert len(first.read_text().splitlines()) < 12
    res = run_sweep(s, tmp_path / "killed", workers=2)
    assert not res.failed
    for e in res.entries:
        assert metrics(tmp_path / "killed" / "runs" / e.name) == \
            metrics(tmp_path / "clean" / "runs" / e.name)


def test_a_different_spec_in_the_same_directory_is_refused(tmp_path):
    from klppo.rl.config import ConfigError

    run_sweep(spec(), tmp_path / "sw", workers=1)
    with pytest.raises(ConfigError, match="different sweep spec"):
        run_sweep(spec(seeds=[5]), tmp_path / "sw", workers=1)


def test_ray_backend_on_a_local_instance(tmp_path):
    ray = pytest.importorskip("ray")
    try:
        res = run_sweep(spec(conditions={"clip": {"objective": "clip"},
                                         "psk": {"objective": "per_sample_kl"}}),
                        tmp_path / "ray", backend="ray")
    finally:
        ray.shutdown()
    assert [e.state for e in res.entries] == ["finished", "finished"]
    a, b = (metrics(tmp_path / "ray" / "runs" / e.name) for e in res.entries)
    drop = lambda rs: [{k: v for k, v in r.items() if not k.startswith("loss")}  # noqa: E731
                       for r in rs]
    assert drop(a) == drop(b)  # Theorem 1 holds across processes too
