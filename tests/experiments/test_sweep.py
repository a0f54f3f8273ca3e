import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from klppo.cli import main
from klppo.experiments import pool
from klppo.experiments.sweep import SweepSpec, SweepStop, expand, run_sweep
from klppo.rl import config as C
from klppo.rl.trainer import TIMING_KEYS
from klppo.runs import rundir as R
from klppo.runs.metrics import read_metrics
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
    names = [r.name for r in runs]
    assert "CartPole-v1__kl__lr=0.001__1" in names
    cfg = {r.name: r.config for r in runs}["CartPole-v1__kl__lr=0.001__1"]
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
    assert main(["sweep", "--spec", str(spec_file(tmp_path, s)), "--out", str(tmp_path / "sw"),
                 "--workers", "2"]) == 1
    out = capsys.readouterr().out
    assert "1 finished, 0 interrupted, 2 failed, 0 not started" in out and "FAILED" in out
    # the table of the finished runs (as klppo report writes it), and how to make the report
    (row,) = [ln for ln in out.splitlines() if ln.startswith("| CartPole-v1 |")]
    assert row.startswith("| CartPole-v1 | good | 1 |")
    assert f"klppo report {tmp_path / 'sw'} --out REPORT_DIR" in out
    assert not any(state["good"].name in ln for ln in out.splitlines()
                   if ln.startswith("["))  # finished before: not rerun
    nan_line = next(ln for ln in out.splitlines() if ln.startswith("[") and "NaN" in ln)
    # its own time, then the sweep's, and the time left (- until a second run has ended)
    assert re.search(r"\(\d+ s, sweep at \d+ s, ETA (-|\d+:\d\d)\)$", nan_line)
    after = (tmp_path / "sw" / "runs" / state["good"].name / "metrics.jsonl").stat().st_mtime
    assert before == after


# ---------------------------------------------------------------- stopping and killing a sweep
#: 2 runs of 32 iterations (with 1 worker a stop finds one running and one not started; long
#: enough that a loaded machine cannot finish one before the test sees it running)
STOP_SPEC = spec(conditions={"clip": {"objective": "clip"}}, seeds=[0, 1],
                 base={**BASE, "total_steps": 16384})


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """STOP_SPEC run without interruption (the reference for the resumed runs)."""
    out = tmp_path_factory.mktemp("clean") / "sw"
    assert not run_sweep(STOP_SPEC, out, workers=2).unfinished
    return out


def spec_file(tmp_path, s):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(dataclasses.asdict(s)))
    return path


def start_sweep(spec_path, out, workers=2, group_size=1):
    """A sweep in a subprocess; by default a process per run (these tests follow the workers
    one by one; tests/experiments/test_sweep_batched.py stops a grouped one)."""
    return subprocess.Popen([sys.executable, "-m", "klppo", "sweep", "--spec", str(spec_path),
                             "--out", str(out), "--workers", str(workers), "--group-size",
                             str(group_size)],
                            cwd=ROOT,
                            start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def worker_pids(sweep_dir):
    """Live (not zombie) worker processes whose run directory is under ``sweep_dir``."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue
        if b"klppo.experiments.worker" in argv and state != "Z" and \
                any(a.startswith(str(sweep_dir).encode()) for a in argv):
            pids.append(int(proc.name))
    return pids


def alive(pids):
    return [p for p in pids if Path(f"/proc/{p}").exists() and
            (Path(f"/proc/{p}") / "stat").read_text().rpartition(")")[2].split()[0] != "Z"]


def wait_gone(pids, timeout):
    deadline = time.time() + timeout
    while alive(pids) and time.time() < deadline:
        time.sleep(0.05)
    return alive(pids)


def index_states(sweep_dir):
    runs = json.loads((Path(sweep_dir) / "index.json").read_text())["runs"]
    return {r["seed"]: r["state"] for r in runs}


def run_status(sweep_dir, seed):
    return json.loads((Path(sweep_dir) / "runs" / f"CartPole-v1__clip__{seed}" /
                       "status.json").read_text())


def assert_resumes_exactly(sweep_dir, clean_dir):
    res = run_sweep(STOP_SPEC, sweep_dir, workers=2)
    assert [e.state for e in res.entries] == ["finished"] * 2
    for e in res.entries:
        assert metrics(Path(sweep_dir) / "runs" / e.name) == metrics(clean_dir / "runs" / e.name)


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc")
@pytest.mark.parametrize("sig", [signal.SIGINT,  # SIGTERM: in the slow suite
                                 pytest.param(signal.SIGTERM, marks=pytest.mark.slow)],
                         ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_the_sweep_gracefully_and_a_rerun_resumes_exactly(tmp_path, clean, sig):
    out = tmp_path / "sw"
    proc = start_sweep(spec_file(tmp_path, STOP_SPEC), out, workers=1)
    wait_for_lines(out / "runs" / "CartPole-v1__clip__0" / "metrics.jsonl", 2)
    pids = worker_pids(out)
    assert len(pids) == 1
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, stderr
    assert "0 finished, 1 interrupted, 0 failed, 1 not started" in stdout
    assert "Traceback" not in stderr
    assert wait_gone(pids, 1.0) == []
    assert index_states(out) == {0: "interrupted", 1: "pending"}
    assert run_status(out, 0)["state"] == "interrupted"
    assert len((out / "runs" / "CartPole-v1__clip__0" / "metrics.jsonl").read_text()
               .splitlines()) < 32
    assert not (out / "runs" / "CartPole-v1__clip__1" / "metrics.jsonl").exists()
    assert_resumes_exactly(out, clean)


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc")
def test_a_killed_sweep_leaves_no_worker_behind_and_resumes_exactly(tmp_path, clean):
    out = tmp_path / "sw"
    proc = start_sweep(spec_file(tmp_path, STOP_SPEC), out)
    wait_for_lines(out / "runs" / "CartPole-v1__clip__0" / "metrics.jsonl", 2)
    pids = worker_pids(out)
    assert len(pids) == 2
    proc.kill()  # the sweep only: its workers are in sessions of their own
    proc.communicate()
    assert wait_gone(pids, 10.0) == []
    # they noticed, checkpointed and stopped; they did not run on (a worker still starting up
    # when the sweep died stops before writing anything)
    assert run_status(out, 0)["state"] == "interrupted"
    status_1 = out / "runs" / "CartPole-v1__clip__1" / "status.json"
    assert not status_1.exists() or run_status(out, 1)["state"] == "interrupted"
    assert len((out / "runs" / "CartPole-v1__clip__0" / "metrics.jsonl").read_text()
               .splitlines()) < 32
    assert_resumes_exactly(out, clean)


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc")
def test_a_second_interrupt_kills_the_workers_and_keeps_the_index_consistent(tmp_path, capsys):
    # 2 iterations of 16384 steps: a worker needs seconds to finish its iteration, so the
    # second interrupt (0.3 s after the first) finds it still in its first one (with iterations
    # of 8192 steps a loaded machine saw the worker end gracefully between the two)
    s = spec(conditions={"clip": {"objective": "clip"}}, seeds=[0],
             base={**BASE, "total_steps": 32768, "rollout": {"num_steps": 4096}})
    out = tmp_path / "sw"
    proc = start_sweep(spec_file(tmp_path, s), out, workers=1)
    wait_for_status(out / "runs" / "CartPole-v1__clip__0", "running")
    pids = worker_pids(out)
    # while it runs, a second sweep on the directory is refused, naming the first
    assert main(["sweep", "--spec", str(tmp_path / "spec.yaml"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and f"in use by pid {proc.pid} " in err
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "0 finished, 1 interrupted, 0 failed, 0 not started" in stdout
    assert len(pids) == 1 and alive(pids) == []
    assert index_states(out) == {0: "interrupted"}
    st = run_status(out, 0)
    assert st["state"] == "interrupted" and "killed" in st["error"]
    assert [e.state for e in run_sweep(s, out, workers=1).entries] == ["finished"]


def wait_for_status(run_dir, state, timeout=60.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if json.loads((run_dir / "status.json").read_text())["state"] == state:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.02)


def test_a_different_spec_in_the_same_directory_is_refused(tmp_path):
    from klppo.rl.config import ConfigError

    run_sweep(spec(), tmp_path / "sw", workers=1)
    with pytest.raises(ConfigError, match="different sweep spec"):
        run_sweep(spec(seeds=[5]), tmp_path / "sw", workers=1)


@pytest.mark.slow  # starts a local Ray instance (16 s)
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


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc")
def test_without_prctl_a_worker_still_stops_when_its_parent_dies(tmp_path):
    """The run is far too long to finish in the test (20,000 iterations), so it stops only if
    the parent watch stops it: status interrupted, a checkpoint, a few iterations done."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = expand(spec(base={**BASE, "total_steps": 512 * 20_000}))[0].config
    R.write_yaml(run_dir / "config.yaml", C.to_dict(dataclasses.replace(cfg, out=str(run_dir))))
    worker = ("import sys, klppo.experiments.worker as w; "
              "w._set_parent_death_signal = lambda s: False; sys.exit(w.main(sys.argv[1:]))")
    parent = ("import subprocess, sys, time; "
              f"p = subprocess.Popen([sys.executable, '-c', {worker!r}, {str(run_dir)!r}], "
              "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
              "print(p.pid, flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", parent], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    pid = int(proc.stdout.readline())
    wait_for_lines(run_dir / "metrics.jsonl", 2)
    proc.kill()
    proc.wait()
    assert wait_gone([pid], 10.0) == []
    assert json.loads((run_dir / "status.json").read_text())["state"] == "interrupted"
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) < 20_000
    assert (run_dir / "checkpoint.pt").exists()


def test_a_run_directory_another_process_holds_is_waited_for(tmp_path, monkeypatch):
    out = tmp_path / "sw"
    run_dir = out / "runs" / "CartPole-v1__base__0"
    run_dir.mkdir(parents=True)
    lock = R.DirLock(run_dir).acquire()
    monkeypatch.setattr(pool, "BUSY_WAIT_S", 0.3)  # held for longer than the sweep waits: failed
    (e,) = run_sweep(spec(), out, workers=1).entries
    assert e.state == "failed" and f"in use by pid {os.getpid()} " in e.error
    assert not (run_dir / "status.json").exists()  # not ours to write
    monkeypatch.setattr(pool, "BUSY_WAIT_S", 60.0)  # released while the sweep waits: it runs
    released = []
    threading.Timer(1.0, lambda: (released.append(time.time()), lock.release())).start()
    (e,) = run_sweep(spec(), out, workers=1).entries
    assert e.state == "finished"
    assert (run_dir / "metadata.json").stat().st_mtime >= released[0]


@pytest.mark.slow
def test_ray_backend_stops_on_request_and_the_runs_resume(tmp_path):
    ray = pytest.importorskip("ray")
    s = spec(conditions={"clip": {"objective": "clip"}}, seeds=[0, 1, 2, 3],
             base={**BASE, "total_steps": 65536})  # long enough to be stopped
    stop = SweepStop()

    def stop_when_both_run():  # a cancel that reaches a task still starting may be lost
        while sum(bool(f.read_text()) for f in (tmp_path / "ray").glob("runs/*/metrics.jsonl")) < 2:
            time.sleep(0.02)
        stop.request()

    threading.Thread(target=stop_when_both_run, daemon=True).start()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)  # 2 run, 2 wait
    try:
        res = run_sweep(s, tmp_path / "ray", backend="ray", stop=stop, group_size=1)
    finally:
        ray.shutdown()
    states = [e.state for e in res.entries]
    assert "interrupted" in states and "pending" in states and "failed" not in states, states
    assert worker_pids(tmp_path / "ray") == []
    assert [e.state for e in run_sweep(s, tmp_path / "ray", workers=2).entries] == \
        ["finished"] * 4


def test_a_run_left_running_by_a_dead_worker_is_resumed_not_skipped(tmp_path):
    out = tmp_path / "sw"
    (e,) = run_sweep(spec(), out, workers=1).entries
    before = metrics(out / "runs" / e.name)
    R.write_status(out / "runs" / e.name, "running", iteration=1)  # as a SIGKILLed worker leaves
    (again,) = run_sweep(spec(), out, workers=1).entries
    assert again.state == "finished" and again.wall_s is not None  # its worker ran again
    assert metrics(out / "runs" / e.name) == before


def test_runs_launch_seed_by_seed(tmp_path, monkeypatch):
    """A sweep stopped part way holds whole comparisons: every condition of seed 0 starts
    before any run of seed 1 (the order of `seeds`, not of the names)."""
    import klppo.experiments.sweep as S

    launched, grouped = [], []

    def run_local(todo, workers, done, stop, groups=None):
        launched.extend(todo)
        grouped.extend(groups or [])

    monkeypatch.setattr(S, "run_local", run_local)
    s = spec(conditions={"a": {"objective": "clip"}, "b": {"objective": "kl_penalty"}},
             seeds=[3, 0, 1])
    for size in (1, None):  # a process per run; the default grouping
        launched.clear()
        grouped.clear()
        run_sweep(s, tmp_path / str(size), workers=1, group_size=size)
        assert [n.rsplit("__", 1)[1] for n in launched] == ["3", "3", "0", "0", "1", "1"]
        assert {n.split("__")[1] for n in launched[:2]} == {"a", "b"}
    (group,) = grouped  # one worker, one shape: one group, in the same order
    assert [n.rsplit("__", 1)[1] for n in group] == ["3", "3", "0", "0", "1", "1"]
