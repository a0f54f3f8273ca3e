"""``--track wandb``: what reaches W&B (with a recording stand-in for the wandb module), a real
offline run when wandb is installed, and the error when it is not."""

import dataclasses
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

import klppo.rl as rl
from klppo.runs.metrics import wandb_run_id

ROOT = Path(__file__).resolve().parents[2]


def small(out, steps=1024):
    c = rl.preset("klip/cartpole")
    return dataclasses.replace(c, out=str(out), total_steps=steps, tensorboard=False,
                               track="wandb")


class FakeRun:
    def __init__(self, **kw):
        self.init = kw
        self.logged: list[tuple[int, dict]] = []
        self.finished = False

    def log(self, data, step):
        self.logged.append((step, data))

    def finish(self):
        self.finished = True


@pytest.fixture
def fake_wandb(monkeypatch):
    runs: list[FakeRun] = []

    def init(**kw):
        runs.append(FakeRun(**kw))
        return runs[-1]

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    return runs


def test_every_iteration_is_logged_at_its_global_step(tmp_path, fake_wandb):
    res = rl.train(small(tmp_path / "run"))
    (run,) = fake_wandb
    assert run.finished
    assert run.init["project"] == "klppo" and run.init["dir"] == str(res.run_dir)
    assert run.init["config"]["objective"] == "clip" and run.init["resume"] == "allow"
    assert run.init["id"] == wandb_run_id(res.run_dir)
    assert [s for s, _ in run.logged] == [m["global_step"] for m in res.metrics]
    for (_, data), m in zip(run.logged, res.metrics):
        assert data["charts/episode_return_mean"] == m["episode_return_mean"]
        assert data["kl/rollout"] == m["kl_rollout"]
        assert data["policy/frac_kill"] == m["frac_kill"]
        assert "other/global_step" not in data and "charts/global_step" not in data
        assert "charts/episodic_return" not in data  # one name per quantity
    assert run.init["entity"] is None and run.init["group"] is None and run.init["tags"] is None


def test_project_entity_group_tags_and_cleanrl_names(tmp_path, fake_wandb):
    from klppo.rl.config import WandbConfig

    cfg = dataclasses.replace(small(tmp_path / "run"), metric_names="cleanrl",
                              wandb=WandbConfig("kl-study", "my-team", "ablation", ("a", "b")))
    res = rl.train(cfg)
    (run,) = fake_wandb
    assert (run.init["project"], run.init["entity"], run.init["group"], run.init["tags"]) == \
        ("kl-study", "my-team", "ablation", ["a", "b"])
    assert run.init["config"]["wandb"]["project"] == "kl-study"  # the config is the W&B config
    assert run.init["config"]["ppo"]["lr"] == cfg.ppo.lr
    data = run.logged[-1][1]
    assert data["charts/episodic_return"] == res.metrics[-1]["episode_return_mean"]
    assert "charts/episode_return_mean" not in data and data["kl/rollout"] > 0


@pytest.mark.parametrize("field, value", [("project", ""), ("project", "a/b"),
                                          ("entity", "x#y"), ("tags", ("x" * 65,))])
def test_names_wandb_refuses_are_refused_before_the_run(tmp_path, field, value):
    from klppo.rl.config import ConfigError, WandbConfig

    cfg = dataclasses.replace(small(tmp_path / "run"),
                              wandb=dataclasses.replace(WandbConfig(), **{field: value}))
    with pytest.raises(ConfigError, match=f"wandb.{field}="):
        rl.train(cfg)
    assert not (tmp_path / "run").exists()


def test_a_sweep_groups_its_runs_under_its_name(tmp_path, fake_wandb):
    from klppo.experiments.sweep import SweepSpec, run_sweep

    spec = SweepSpec(preset="klip/cartpole", seeds=[0],
                     base={"total_steps": 512, "tensorboard": False, "track": "wandb"})
    run_sweep(spec, tmp_path / "my-sweep", workers=1)
    from klppo.rl.lifecycle import read_run_config

    cfg = read_run_config(next((tmp_path / "my-sweep" / "runs").iterdir()))
    assert cfg.wandb.group == "my-sweep"


def test_run_ids_are_stable_per_directory_and_distinct_across_directories(tmp_path):
    a, b = tmp_path / "sweep1" / "seed0", tmp_path / "sweep2" / "seed0"
    assert wandb_run_id(a) == wandb_run_id(a)
    assert wandb_run_id(a) != wandb_run_id(b)
    assert wandb_run_id(a).startswith("seed0-")


def test_missing_wandb_names_the_pip_command_before_creating_the_run(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with pytest.raises(ImportError, match=r"pip install -c constraints.txt -e '\.\[wandb\]'"):
        rl.train(small(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_offline_run_with_the_real_package(tmp_path):
    pytest.importorskip("wandb")
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true",
           "OMP_NUM_THREADS": "1"}
    out = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "klppo", "train", "--env", "CartPole-v1",
                    "--total-steps", "1024", "--out", str(out), "--track", "wandb",
                    "--wandb.group", "group-g1", "--wandb.tags", "tag-a1",
                    "--no-tensorboard"], cwd=ROOT, env=env, check=True, capture_output=True,
                   timeout=240)
    (record,) = list((out / "wandb").glob("offline-run-*/run-*.wandb"))
    data = record.read_bytes()
    # the metric names and the run id are in the run's record file, ready for `wandb sync`
    assert b"charts/episode_return_mean" in data and b"kl/rollout" in data
    assert b"kl/kl_rollout" not in data and b"charts/episodic_return" not in data
    assert wandb_run_id(out).encode() in data
    assert b"group-g1" in data and b"tag-a1" in data  # where the run goes
    assert b"update_epochs" in data and b"CartPole-v1" in data  # the config, as W&B's config


def test_disabled_mode_runs_without_network_or_files(tmp_path):
    pytest.importorskip("wandb")
    env = {**os.environ, "WANDB_MODE": "disabled", "WANDB_SILENT": "true",
           "OMP_NUM_THREADS": "1"}
    out = tmp_path / "run"
    res = subprocess.run([sys.executable, "-m", "klppo", "train", "--total-steps", "1024",
                          "--out", str(out), "--track", "wandb", "--wandb.project", "p",
                          "--wandb.tags", "t1", "t2", "--no-tensorboard"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr
    assert (out / "metrics.jsonl").exists() and not list(out.glob("wandb/offline-run-*"))
