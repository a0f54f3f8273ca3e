"""Exact resume on every env family klppo ships presets for, one writer per run directory,
and a failed or damaged run that says what went wrong (issue: trust everywhere)."""

import copy
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from klppo import rl
from klppo.cli import main
from klppo.rl.trainer import TIMING_KEYS
from klppo.runs.rundir import DirLock, create_run_dir
from tests.waiting import wait_for_lines

ROOT = Path(__file__).resolve().parents[2]

#: (preset, flags) of short runs: 4-6 iterations of a few thousand steps each
CASES = {
    "cartpole": ("klip/cartpole", ["--total-steps", "3072"]),
    # the adaptive lr goes on from its checkpointed value (rsl_rl #221 restarts it)
    "cartpole_adaptive_lr": ("klip/cartpole", ["--total-steps", "3072", "--kl.actuator", "lr",
                                               "--ppo.no-anneal-lr"]),
    # BAPO's clip bounds: chosen per minibatch from the resumed parameters, record checkpointed
    "cartpole_bapo": ("klip/cartpole", ["--total-steps", "3072", "--ppo.band-controller", "bapo"]),
    # the entropy coefficient goes on from its controller's checkpointed state (PID integrator)
    "cartpole_entropy_control": ("klip/cartpole", [
        "--total-steps", "3072", "--ppo.ent-coef", "0.01", "--ppo.ent-target", "0.66",
        "--ppo.ent-controller", "pid"]),
    # stale rollouts: the past policies the rollouts act with are checkpointed
    "cartpole_stale": ("klip/cartpole", ["--total-steps", "3072", "--ppo.staleness", "2",
                                         "--ppo.mismatch-correction", "tis"]),
    # evaluations during training (their best kept): the same numbers after a resume
    "cartpole_eval": ("klip/cartpole", ["--total-steps", "3072", "--eval-every", "2",
                                        "--eval-episodes", "2"]),
    "lunarlander": ("klip/lunarlander", ["--total-steps", "8192", "--rollout.num-steps", "128"]),
    "hopper": ("klip/hopper", ["--total-steps", "2560", "--rollout.num-steps", "512"]),
    "ant_v5": ("klip/ant-v5", ["--total-steps", "1280", "--rollout.num-steps", "256"]),
    "pendulum_normalised": ("klip/cartpole", [
        "--env", "Pendulum-v1", "--total-steps", "2048", "--rollout.num-envs", "2",
        "--rollout.num-steps", "256", "--rollout.norm-obs", "--rollout.norm-reward"]),
    "marl": ("marl/simple_adversary", ["--total-steps", "4000", "--rollout.num-steps", "50"]),
    "marl_stale": ("marl/simple_adversary", ["--total-steps", "4000", "--rollout.num-steps", "50",
                                             "--ppo.staleness", "1", "--ppo.mismatch-correction",
                                             "icepop"]),
    "marl_continuous": ("marl/simple_adversary_continuous", [
        "--total-steps", "2400", "--rollout.num-steps", "50", "--rollout.norm-obs",
        "--rollout.norm-reward"]),
}


def metrics(run_dir):
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if k not in TIMING_KEYS} for x in lines]


def cli_args(case, out):
    preset, flags = CASES[case]
    return ["train", "--preset", preset, *flags, "--checkpoint-every", "1", "--no-tensorboard",
            "--out", str(out)]


def sigkill_after(args, run_dir, lines):
    proc = subprocess.Popen([sys.executable, "-m", "klppo", *args], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for_lines(run_dir / "metrics.jsonl", lines)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)


#: variants of a case the default suite has, in the slow suite (CI runs it)
SLOW = {"marl_stale", "marl_continuous"}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow if c in SLOW else ())
                                  for c in CASES])
def test_sigkill_then_resume_equals_uninterrupted_run(tmp_path, case):
    """Classic control, Box2D, MuJoCo and a normalised Box env: the env's physics and RNG are
    restored by replay, so the resumed metrics equal the uninterrupted run's, and two resumes
    of one checkpoint agree."""
    pytest.importorskip({"lunarlander": "Box2D", "hopper": "mujoco", "ant_v5": "mujoco",
                         "marl": "mpe2", "marl_stale": "mpe2",
                         "marl_continuous": "mpe2"}.get(case, "gymnasium"))
    assert main(cli_args(case, tmp_path / "full")) == 0
    full = metrics(tmp_path / "full")
    killed = tmp_path / "killed"
    sigkill_after(cli_args(case, killed), killed, 2)
    twin = tmp_path / "twin"
    shutil.copytree(killed, twin)
    assert len(metrics(killed)) < len(full), "the kill came too late to test anything"
    for run in (killed, twin):
        res = rl.resume(run)
        assert res.status == "finished"
        assert metrics(run) == full
        assert "warnings" not in json.loads((run / "status.json").read_text())


def test_an_env_that_cannot_be_replayed_is_reported_loudly(tmp_path, caplog):
    import tests.rl.envs_for_tests  # noqa: F401

    cfg = rl.preset("klip/cartpole")
    cfg.env, cfg.total_steps, cfg.tensorboard = "KlppoTest/Nondeterministic-v0", 1024, False
    cfg.out, cfg.checkpoint_every, cfg.rollout.vectorization = str(tmp_path / "r"), 1, "sync"
    rl.train(cfg)
    ck = tmp_path / "r" / "checkpoint.pt"
    import torch

    state = torch.load(ck, weights_only=False)
    state["iteration"], state["global_step"] = 1, 512  # pretend it stopped after iteration 1
    torch.save(state, ck)
    lines = (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    (tmp_path / "r" / "metrics.jsonl").write_text(lines[0] + "\n")
    res = rl.resume(tmp_path / "r")
    status = json.loads((tmp_path / "r" / "status.json").read_text())
    assert res.status == "finished"
    assert any("resume is not exact" in w and "KlppoTest/Nondeterministic-v0" in w
               for w in status["warnings"])
    assert "resume is not exact" in caplog.text


SINGLE_AGENT_PRESETS = [n for n in sorted(__import__("klppo.rl.presets").rl.presets.PRESETS)
                        if not n.startswith("marl/")]


@pytest.mark.parametrize("name", SINGLE_AGENT_PRESETS)
def test_preset_envs_are_all_exactly_restorable(name):
    """Every single-agent preset's vector env, stepped part way into its episodes, saved and
    restored into a fresh env, continues with the same observations, rewards and ends as the
    original (the multi-agent presets are checked by the resume tests above)."""
    from klppo.rl.envs import env_state, make_vector_env, restore_env_state
    from klppo.rl.presets import PRESETS

    cfg = PRESETS[name]()
    pytest.importorskip("Box2D" if "lunar" in name else
                        "mujoco" if name not in ("klip/cartpole",) else "gymnasium")
    rng = np.random.default_rng(0)
    make = lambda: make_vector_env(cfg.env, 2, 7, cfg.rollout.vectorization)  # noqa: E731
    env = make()
    space = env.single_action_space
    acts = lambda: np.stack([space.sample() for _ in range(2)])  # noqa: E731
    space.seed(int(rng.integers(1 << 31)))
    for _ in range(30):
        env.step(acts())
    saved = copy.deepcopy(env_state(env))
    later = [acts() for _ in range(40)]
    expected = [env.step(a)[:4] for a in later]
    twin = make()
    assert restore_env_state(twin, saved, cfg.env) == []
    for a, want in zip(later, expected):
        got = twin.step(a)[:4]
        for g, w in zip(got, want):
            assert np.array_equal(g, w), name
    env.close()
    twin.close()


def test_second_writer_gets_one_line_naming_the_holder(tmp_path, capsys):
    out = tmp_path / "busy"
    out.mkdir()
    with DirLock(out):
        assert main(cli_args("cartpole", out)) == 2
        err = capsys.readouterr().err.strip()
        assert "in use by pid" in err and len(err.splitlines()) == 1
        assert main(["train", "--resume", str(out)]) == 2
    assert not (out / "metrics.jsonl").exists()


def test_a_refused_resume_prints_its_refusal_alone(tmp_path, capsys):
    # "resuming RUN from iteration K of N" comes with the first iteration's line, after every
    # check: a run in use prints the refusal and nothing on stdout
    out = tmp_path / "r"
    assert main([*cli_args("cartpole", out), "--total-steps", "1024"]) == 0
    capsys.readouterr()
    with DirLock(out):
        assert main(["train", "--resume", str(out), "--total-steps", "2048"]) == 2
    res = capsys.readouterr()
    assert res.out == "" and "in use by pid" in res.err and len(res.err.splitlines()) == 1
    assert main(["train", "--resume", str(out), "--total-steps", "2048"]) == 0
    assert capsys.readouterr().out.startswith(f"resuming {out} from iteration 2 of 4\n")
    assert main(["train", "--resume", str(out)]) == 0  # finished: nothing left, still said
    assert capsys.readouterr().out.startswith(f"resuming {out} from iteration 4 of 4\n")


def test_a_refused_env_prints_no_rounding_note_first(tmp_path, capsys):
    # the default total (100,000) is no whole number of rollouts: its note waits for the run
    assert main(["train", "--env", "CartPole-v2", "--out", str(tmp_path / "r")]) == 2
    res = capsys.readouterr()
    assert res.out == "" and len(res.err.splitlines()) == 1 and "CartPole-v2" in res.err


def test_default_run_names_never_collide(tmp_path):
    a = create_run_dir(tmp_path / "CartPole__clip__0__20260101-000000", unique=True)
    b = create_run_dir(tmp_path / "CartPole__clip__0__20260101-000000", unique=True)
    assert a != b and a.is_dir() and b.is_dir() and b.name.endswith("-2")


def _damaged_run(tmp_path):
    run = tmp_path / "r"
    assert main(cli_args("cartpole", run)) == 0
    return run


@pytest.mark.parametrize("damage, expect", [
    ("empty", "checkpoint.pt: empty file"),
    ("truncated", "unreadable checkpoint"),
    ("garbage", "unreadable checkpoint"),
    ("metrics_deleted", "metrics.jsonl: the checkpoint is at iteration 6 but the file is missing"),
    ("metrics_shortened", "holds 3 of them"),
])
def test_damaged_run_directory_is_one_line_and_status_failed(tmp_path, capsys, damage, expect):
    run = _damaged_run(tmp_path)
    ck, mj = run / "checkpoint.pt", run / "metrics.jsonl"
    data = ck.read_bytes()
    if damage == "empty":
        ck.write_bytes(b"")
    elif damage == "truncated":
        ck.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        ck.write_bytes(b"\x00\xff" * 100)
    elif damage == "metrics_deleted":
        mj.unlink()
    else:
        mj.write_text("\n".join(mj.read_text().splitlines()[:3]) + "\n")
    capsys.readouterr()
    assert main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert expect in err and len(err.splitlines()) == 1 and "Traceback" not in err
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "failed" and expect in status["error"]


def test_torn_checkpoint_write_leaves_no_temp_file_after_resume(tmp_path):
    run = _damaged_run(tmp_path)
    (run / ".checkpoint.pt.tmp99999").write_bytes(b"half a checkpoint")
    (run / "metrics.jsonl").write_text(
        "\n".join((run / "metrics.jsonl").read_text().splitlines()) + "\n{\"iteration\": 7, ")
    assert rl.resume(run).status == "finished"
    assert not list(run.glob(".*tmp*"))


def test_full_disk_fails_named_keeps_last_checkpoint_and_no_temp_file(tmp_path, monkeypatch):
    import errno
    import os

    from klppo.runs import rundir

    calls = {"n": 0}
    real_fsync = os.fsync

    def fsync(fd):  # a nearly full disk: small files still fit, the third checkpoint does not
        if os.fstat(fd).st_size > 20_000:
            calls["n"] += 1
            if calls["n"] > 2:
                raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    monkeypatch.setattr(rundir.os, "fsync", fsync)
    cfg = rl.preset("klip/cartpole")
    cfg.total_steps, cfg.tensorboard, cfg.out, cfg.checkpoint_every = 3072, False, \
        str(tmp_path / "r"), 1
    with pytest.raises(rl.TrainingError, match="No space left on device") as e:
        rl.train(cfg)
    assert "last good checkpoint (iteration" in str(e.value)
    monkeypatch.undo()
    run = tmp_path / "r"
    assert not list(run.glob(".*tmp*"))
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "failed" and "No space left" in status["error"]
    assert rl.resume(run).status == "finished"  # from the last good checkpoint


def test_non_finite_loss_stops_with_the_iteration_and_keeps_checkpoint(tmp_path):
    import tests.rl.envs_for_tests  # noqa: F401

    cfg = rl.preset("klip/cartpole")
    cfg.env, cfg.total_steps, cfg.tensorboard = "KlppoTest/HugeReward-v0", 8192, False
    cfg.out, cfg.checkpoint_every, cfg.rollout.vectorization = str(tmp_path / "r"), 1, "sync"
    with pytest.raises(rl.TrainingError, match=r"iteration \d+: .*non-finite") as e:
        rl.train(cfg)
    assert "last good checkpoint (iteration" in str(e.value)
    status = json.loads((tmp_path / "r" / "status.json").read_text())
    assert status["state"] == "failed" and "non-finite" in status["error"]
    assert (tmp_path / "r" / "checkpoint.pt").exists()


def test_exploding_value_loss_is_warned(tmp_path, caplog):
    from klppo.rl.monitor import ExplosionMonitor

    mon = ExplosionMonitor()
    for i, v in enumerate([1.0, 2.0, 1.5, 1.2]):
        assert mon.check({"iteration": i + 1, "value_loss": v, "kl_rollout": 0.01}) == []
    (w,) = mon.check({"iteration": 5, "value_loss": 7e11, "kl_rollout": 0.01})
    assert "iteration 5: value_loss = 7e+11" in w
    cfg = rl.preset("klip/cartpole")
    cfg.total_steps, cfg.tensorboard, cfg.out = 8192, False, str(tmp_path / "r")
    cfg.ppo.lr, cfg.ppo.anneal_lr = 1e6, False
    rl.train(cfg)  # huge but finite: the run finishes, with warnings
    status = json.loads((tmp_path / "r" / "status.json").read_text())
    assert any("critic is diverging" in w for w in status["warnings"])
    assert any("kl_rollout" in w and "nats per sample" in w for w in status["warnings"])
    assert "diverging" in caplog.text


def test_a_second_signal_while_the_envs_close_leaves_the_stopped_runs_status(tmp_path,
                                                                            monkeypatch):
    """A first SIGTERM stops after the iteration; a second one that lands while the envs close
    (the stop handler is gone by then: a sweep's killed parent was seen to cause this) must not
    leave status.json at 'running'."""
    from klppo.rl.lifecycle import RunTrainer
    from tests.signalguard import send_self

    def interrupted_close(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(RunTrainer, "close", interrupted_close)
    cfg = rl.preset("klip/cartpole")
    cfg.total_steps, cfg.tensorboard, cfg.out = 4096, False, str(tmp_path / "r")

    def stop_at_2(m):
        if m["iteration"] == 2:
            send_self(signal.SIGTERM)

    with pytest.raises(KeyboardInterrupt):
        rl.train(cfg, on_iteration=stop_at_2)
    status = json.loads((tmp_path / "r" / "status.json").read_text())
    assert status["state"] == "interrupted" and status["iteration"] == 2


@pytest.mark.parametrize("group", [False, True])
def test_a_run_stopped_before_its_first_checkpoint_restarts_and_equals_the_whole_run(tmp_path,
                                                                                   group):
    """The window between the first metrics line and the first checkpoint (a kill, a full
    disk): metrics.jsonl holds iteration 1, there is no checkpoint.pt. The resume starts the
    run again, as the failure message promises, and ends with the uninterrupted run's metrics;
    a run whose metrics go past the first checkpoint's iteration and has none is refused."""
    args = ["--total-steps", "2048", "--checkpoint-every", "1", "--no-tensorboard"]
    assert main(["train", "--preset", "klip/cartpole", *args, "--out",
                 str(tmp_path / "full")]) == 0
    full = metrics(tmp_path / "full")
    run = tmp_path / "cut"
    shutil.copytree(tmp_path / "full", run)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text(lines[0] + "\n")
    (run / "checkpoint.pt").unlink()
    status = json.loads((run / "status.json").read_text())
    (run / "status.json").write_text(json.dumps({**status, "state": "running"}))
    if group:  # a group of two: the cut run beside a fresh copy of the same config
        from klppo.rl.engine.rundirs import train_group

        twin = tmp_path / "twin"
        twin.mkdir()
        shutil.copy(run / "config.yaml", twin / "config.yaml")
        assert [r.status for r in train_group([run, twin])] == ["finished", "finished"]
        assert metrics(twin) == full
    else:
        assert rl.resume(run).status == "finished"
    assert metrics(run) == full
    gone = tmp_path / "gone"
    shutil.copytree(tmp_path / "full", gone)
    (gone / "checkpoint.pt").unlink()
    with pytest.raises(rl.ResumeError, match="checkpoint.pt: missing, but metrics.jsonl holds "
                                             "iteration 4"):
        rl.resume(gone)


def test_a_healthy_kl_after_an_annealed_one_is_no_divergence():
    # a run extended with a new total: the lr annealed to ~0 gave KLs of 4e-6, the replanned
    # one a healthy 0.0044 (1000x): no warning; a jump to a KL that is not healthy still warns,
    # in nats per sample
    from klppo.rl.monitor import ExplosionMonitor

    mon = ExplosionMonitor()
    for i in range(10):
        assert mon.check({"iteration": i + 1, "kl_rollout": 4.29e-6}) == []
    assert mon.check({"iteration": 11, "kl_rollout": 0.00444}) == []
    mon = ExplosionMonitor()
    for i in range(10):
        mon.check({"iteration": i + 1, "kl_rollout": 4.29e-5})
    (w,) = mon.check({"iteration": 11, "kl_rollout": 0.2})
    assert "kl_rollout = 0.2 nats per sample is" in w and "(4.29e-05 nats per sample)" in w
