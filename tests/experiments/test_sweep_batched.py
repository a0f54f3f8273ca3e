"""``klppo sweep`` groups its runs (``--group-size 1``: a process per run): groups by what shapes
the computation, spread over the workers; stopping and resuming; the report; the refusals
(issues #22, #29)."""

import dataclasses
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from klppo import rl
from klppo.cli import main
from klppo.experiments.sweep import SweepSpec, expand, plan_groups, run_sweep
from klppo.rl import config as C
from klppo.rl.trainer import TIMING_KEYS
from klppo.runs.metrics import read_metrics
from tests.waiting import wait_for_lines

ROOT = Path(__file__).resolve().parents[2]
BASE = {"total_steps": 1024, "tensorboard": False}


def metrics(run_dir):
    recs, _ = read_metrics(Path(run_dir) / "metrics.jsonl")
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in recs]


def engine_of(run_dir):
    return json.loads((Path(run_dir) / "metadata.json").read_text()).get("engine")


MIXED = SweepSpec(preset="klip/cartpole", base=dict(BASE), seeds=[0, 1], conditions={
    "clip": {"objective": "clip"},
    "kl": {"objective": "kl_penalty", "kl": {"controller": "step", "target": 0.02}},
    "trunk": {"objective": "clip", "net": {"shared_trunk": True}},
})


def test_plan_groups_splits_by_shape_over_the_workers_and_by_size():
    spec = dataclasses.replace(MIXED, conditions={
        **MIXED.conditions, "big": {"objective": "clip", "rollout": {"num_envs": 8}}})
    plans = expand(spec)
    names = lambda *conds: sorted(p.name for p in plans if p.condition in conds)  # noqa: E731
    groups, notes = plan_groups(plans)
    assert notes == []  # nothing is refused: a shared trunk is a torch stack's row
    assert sorted(map(sorted, groups)) == sorted([names("big"), names("clip", "kl"),
                                                  names("trunk")])
    two = plan_groups(plans, workers=2)[0]  # each shape over both workers
    assert sorted(len(g) for g in two) == [1, 1, 1, 1, 2, 2]
    assert [len(g) for g in plan_groups(plans, group_size=3)[0]] == [3, 1, 2, 2]
    assert plan_groups(plans, group_size=1)[0] == [[p.name] for p in plans]  # a process each
    cuda = dataclasses.replace(MIXED, base={**BASE, "device": "cuda"})
    torch_on_cuda = dataclasses.replace(cuda, conditions={"t": {"fast_path": False}})
    if not torch.cuda.is_available():  # a device that does not resolve: refused, one line
        for spec in (cuda, torch_on_cuda):
            with pytest.raises(C.ConfigError, match="device='cuda'"):
                plan_groups(expand(spec))
    torch_on_cpu = dataclasses.replace(MIXED, conditions={"t": {"fast_path": False}})
    assert len(plan_groups(expand(torch_on_cpu))[0]) == 1  # the torch stack's
    with pytest.raises(C.ConfigError, match="group_size=0"):
        plan_groups(plans, 0)


def test_grouping_is_by_the_spaces_the_env_makes_not_its_id():
    """LunarLander's discrete and continuous versions share an id but not a network; wind (a
    kwarg that changes no space) still shares one (issue #32)."""
    pytest.importorskip("Box2D")
    spec = SweepSpec(preset="klip/lunarlander", base={**BASE, "total_steps": 16384}, seeds=[0],
                     conditions={"discrete": {}, "continuous": {"env_kwargs": {"continuous": True}},
                                 "windy": {"env_kwargs": {"enable_wind": True}}})
    groups = plan_groups(expand(spec))[0]
    assert sorted(map(sorted, groups)) == [["LunarLander-v3__continuous__0"],
                                           sorted(["LunarLander-v3__discrete__0",
                                                   "LunarLander-v3__windy__0"])]


def test_a_sweep_trains_its_groups_and_reports(tmp_path, capsys, caplog):
    out = tmp_path / "sw"
    res = run_sweep(dataclasses.replace(MIXED, seeds=[0]), out, workers=1)
    assert [e.state for e in res.entries] == ["finished"] * 3
    for e in res.entries:
        run = out / "runs" / e.name
        # a group of one trains as `klppo train` does
        assert engine_of(run) == (None if e.condition == "trunk" else
                                  {"name": "group", "runs": 2})
    grouped = out / "runs" / "CartPole-v1__kl__0"
    assert "trained in one process of 2 runs" in (grouped / "worker.log").read_text()
    # report reads the sweep as any other
    assert main(["report", str(out), "--out", str(tmp_path / "rep")]) == 0
    table = (tmp_path / "rep" / "final_returns.md").read_text()
    assert all(f"| {c} |" in table for c in ("clip", "kl", "trunk"))


def start_sweep(spec_path, out):
    return subprocess.Popen([sys.executable, "-m", "klppo", "sweep", "--spec", str(spec_path),
                             "--out", str(out), "--workers", "1"],
                            cwd=ROOT, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc")
def test_a_stopped_batched_sweep_resumes_to_the_numbers_of_its_runs_alone(tmp_path):
    """Ctrl-C: every run of the group finishes its iteration, checkpoints and is interrupted;
    the same command again finishes them with the numbers of an uninterrupted process sweep."""
    spec = SweepSpec(preset="klip/cartpole", base={**BASE, "total_steps": 4096}, seeds=[0, 1],
                     conditions={"clip": {"objective": "clip"}})
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(dataclasses.asdict(spec)))
    out = tmp_path / "sw"
    proc = start_sweep(path, out)
    wait_for_lines(out / "runs" / "CartPole-v1__clip__0" / "metrics.jsonl", 2)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "0 finished, 2 interrupted, 0 failed, 0 not started" in stdout
    for seed in (0, 1):
        run = out / "runs" / f"CartPole-v1__clip__{seed}"
        assert json.loads((run / "status.json").read_text())["state"] == "interrupted"
        assert len((run / "metrics.jsonl").read_text().splitlines()) < 8
    res = run_sweep(spec, out)
    assert [e.state for e in res.entries] == ["finished"] * 2
    for plan in expand(spec):  # the numbers of the run alone
        alone = rl.train(dataclasses.replace(plan.config, out=str(tmp_path / plan.name)))
        assert metrics(out / "runs" / plan.name) == metrics(alone.run_dir)


def test_flags_are_checked_before_anything_starts(tmp_path, capsys):
    out = tmp_path / "sw"
    # the old --engine process is --group-size 1: both at once are refused
    assert main(["sweep", "--out", str(out), "--engine", "process", "--group-size", "2"]) == 2
    assert "--engine process is --group-size 1; give only --group-size" in \
        capsys.readouterr().err
    assert main(["sweep", "--out", str(out), "--group-size", "0"]) == 2
    if not torch.cuda.is_available():  # a device that does not resolve here
        assert main(["sweep", "--out", str(out), "--set", "device=cuda"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 2 and "device='cuda'" in err[-1]
    assert not out.exists()


@pytest.mark.slow
def test_ray_backend_runs_a_batched_group_as_one_task(tmp_path):
    spec = SweepSpec(preset="klip/cartpole", base=dict(BASE), seeds=[0, 1],
                     conditions={"clip": {"objective": "clip"}})
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)  # workers: the cluster's
    try:
        res = run_sweep(spec, tmp_path / "sw", backend="ray")
    finally:
        ray.shutdown()
    assert [e.state for e in res.entries] == ["finished"] * 2
    for e in res.entries:
        assert engine_of(tmp_path / "sw" / "runs" / e.name) == {"name": "group", "runs": 2}
