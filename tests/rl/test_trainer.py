import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import klppo.rl as rl
from klppo.rl.config import ConfigError, from_dict
from klppo.rl.config_checks import validate
from klppo.rl.trainer import TIMING_KEYS, TrainingError, final_return, resume
from tests.waiting import wait_for_lines

ROOT = Path(__file__).resolve().parents[2]


def small(out, objective="clip", steps=2048, **kw):
    c = rl.preset("klip/cartpole")
    return dataclasses.replace(c, out=str(out), objective=objective, total_steps=steps,
                               tensorboard=False, **kw)


def strip(records, drop=()):
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS and k not in drop}
            for r in records]


def test_run_directory_and_metrics(tmp_path):
    res = rl.train(small(tmp_path / "run"))
    d = res.run_dir
    for f in ("config.yaml", "metadata.json", "metrics.jsonl", "checkpoint.pt", "status.json"):
        assert (d / f).exists(), f
    meta = json.loads((d / "metadata.json").read_text())
    assert {"klppo_version", "git_commit", "packages", "command_line", "host",
            "start_time"} <= set(meta)
    lines = (d / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 4 == len(res.metrics)
    m = json.loads(lines[-1])
    for k in ("global_step", "episode_return_mean", "kl_k1", "kl_k3", "frac_in", "frac_pass",
              "frac_kill", "beta_t_q90", "kl_rollout", "lr", "sps", "explained_variance",
              "value_clip_fraction", "entropy", "clip_fraction"):
        assert k in m, k
    assert m["global_step"] == 2048
    assert abs(m["frac_in"] + m["frac_pass"] + m["frac_kill"] - 1) < 1e-6
    assert json.loads((d / "status.json").read_text())["state"] == "finished"
    # lr annealed linearly, once per iteration
    assert [r["lr"] for r in res.metrics] == pytest.approx([3e-4 * (1 - i / 4) for i in range(4)])


def test_same_seed_same_metrics_and_other_seed_differs(tmp_path):
    a = rl.train(small(tmp_path / "a"))
    b = rl.train(small(tmp_path / "b"))
    c = rl.train(dataclasses.replace(small(tmp_path / "c"), seed=1))
    assert strip(a.metrics) == strip(b.metrics)
    assert strip(a.metrics) != strip(c.metrics)


@pytest.mark.parametrize("fast_path", [False, True])
def test_theorem1_end_to_end_clip_equals_per_sample_kl(tmp_path, fast_path):
    """With torch autograd (fast_path False) this is Theorem 1 through the whole network and
    optimiser; the numpy fast path must keep the property."""
    a = rl.train(dataclasses.replace(small(tmp_path / "clip", "clip", steps=5120),
                                     fast_path=fast_path))
    b = rl.train(dataclasses.replace(small(tmp_path / "psk", "per_sample_kl", steps=5120),
                                     fast_path=fast_path))
    drop = {"loss", "loss_objective"}  # the objectives' values differ; gradients do not
    assert strip(a.metrics, drop) == strip(b.metrics, drop)
    assert any(r["frac_kill"] > 0 for r in a.metrics)
    sa = torch.load(a.run_dir / "checkpoint.pt", weights_only=False)["agent"]
    sb = torch.load(b.run_dir / "checkpoint.pt", weights_only=False)["agent"]
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    # with a non-power-of-two minibatch the identity holds to rounding only
    runs = []
    for obj in ("clip", "per_sample_kl"):
        c = dataclasses.replace(small(tmp_path / f"{obj}96", obj, steps=1536),
                                fast_path=fast_path)
        c = dataclasses.replace(c, rollout=dataclasses.replace(c.rollout, num_steps=96),
                                ppo=dataclasses.replace(c.ppo, minibatch_size=96))
        runs.append(torch.load(rl.train(c).run_dir / "checkpoint.pt",
                               weights_only=False)["agent"])
    assert all(torch.allclose(runs[0][k], runs[1][k], atol=1e-4) for k in runs[0])


def test_kill_and_resume_reproduces_uninterrupted_run(tmp_path):
    full = rl.train(dataclasses.replace(small(tmp_path / "full", "kl_penalty", steps=6144),
                                        checkpoint_every=2))
    run = tmp_path / "killed"
    code = ("import dataclasses, klppo.rl as rl; c = rl.preset('klip/cartpole'); "
            f"c = dataclasses.replace(c, out={str(run)!r}, objective='kl_penalty', "
            "total_steps=6144, tensorboard=False, checkpoint_every=2); rl.train(c)")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    metrics = run / "metrics.jsonl"
    wait_for_lines(metrics, 7)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    n_before = len(metrics.read_text().splitlines())
    assert 7 <= n_before < 12, "the run must be killed mid-way"
    res = resume(run)
    assert strip(res.metrics) == strip(full.metrics)
    assert res.status == "finished"


def test_resume_records_its_machine_and_iteration_in_metadata(tmp_path):
    run = tmp_path / "r"
    rl.train(small(run, steps=2048, checkpoint_every=1))
    start = json.loads((run / "metadata.json").read_text())
    assert "resumes" not in start
    resume(run)
    resume(run)
    meta = json.loads((run / "metadata.json").read_text())
    assert {k: v for k, v in meta.items() if k != "resumes"} == start
    n_iter = small(run).num_iterations
    assert [r["iteration"] for r in meta["resumes"]] == [n_iter, n_iter]
    for r in meta["resumes"]:
        assert r["machine"] == start["machine"] and r["packages"] == start["packages"]
        assert r["time"] >= start["start_time"]


def test_nan_environment_stops_with_iteration_and_keeps_checkpoint(tmp_path):
    import tests.rl.envs_for_tests  # noqa: F401

    cfg = small(tmp_path / "nan", steps=4096)
    cfg = dataclasses.replace(cfg, env="tests.rl.envs_for_tests:KlppoTest/NaN-v0",
                              checkpoint_every=1,
                              rollout=dataclasses.replace(cfg.rollout, num_envs=1,
                                                          vectorization="sync"))
    with pytest.raises(TrainingError, match=r"iteration 12.*non-finite observation"):
        rl.train(cfg)
    status = json.loads((tmp_path / "nan" / "status.json").read_text())
    assert status["state"] == "failed" and "iteration 12" in status["error"]
    ck = torch.load(tmp_path / "nan" / "checkpoint.pt", weights_only=False)
    assert ck["iteration"] == 11


def test_truncation_bootstraps_from_final_observation(tmp_path):
    import tests.rl.envs_for_tests  # noqa: F401
    from klppo.rl.config import PPOConfig, RolloutConfig
    from klppo.rl.trainer import _Trainer

    cfg = rl.TrainConfig(env="tests.rl.envs_for_tests:KlppoTest/Counter-v0", total_steps=14,
                         tensorboard=False, rollout=RolloutConfig(num_envs=2, num_steps=7,
                                                                  vectorization="sync"),
                         ppo=PPOConfig(minibatch_size=7))
    tr = _Trainer.alone(rl.validate(cfg), tmp_path)
    tr.start()
    stats = tr.collect_rollout(1)
    tr.env.close()
    b, agent = tr.collector.np, tr.agent
    assert stats.lengths == [3, 3, 3, 3]
    trunc = b["truncated"][:, 0]
    assert trunc.tolist() == [False, False, True, False, False, True, False]
    assert not b["terminated"].any()
    with torch.no_grad():
        v_final = agent.value(torch.tensor([[3.0]])).item()
        v_reset = agent.value(torch.tensor([[0.0]])).item()
    assert b["next_values"][2, 0] == pytest.approx(v_final, abs=1e-6)
    assert b["obs"][3, 0, 0] == 0.0 and b["values"][3, 0] == pytest.approx(v_reset, abs=1e-6)
    assert b["next_values"][0, 0] == b["values"][1, 0]


def test_box_actions_and_normalisation_resume(tmp_path):
    base = rl.TrainConfig(env="Pendulum-v1", total_steps=1024, out=str(tmp_path / "p"),
                          tensorboard=False, checkpoint_every=1)
    cfg = dataclasses.replace(base, rollout=dataclasses.replace(
        base.rollout, num_envs=2, num_steps=128, norm_obs=True, norm_reward=True))
    res = rl.train(cfg)
    assert len(res.metrics) == 4 and np.isfinite(res.metrics[-1]["loss"])
    ck = torch.load(res.run_dir / "checkpoint.pt", weights_only=False)
    assert ck["obs_norm"]["count"] > 1000 and ck["reward_scaler"] is not None

    def interrupt(m):  # a crash after iteration 3 was logged but before its checkpoint
        if m["iteration"] == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        rl.train(dataclasses.replace(cfg, out=str(tmp_path / "q")), on_iteration=interrupt)
    status = json.loads((tmp_path / "q" / "status.json").read_text())
    assert status["state"] == "interrupted"
    again = resume(tmp_path / "q")
    assert strip(again.metrics) == strip(res.metrics)


def test_config_validation_and_overlay():
    with pytest.raises(ConfigError, match=r"ppo.minibatch_size=100"):
        validate(dataclasses.replace(rl.TrainConfig(), ppo=rl.config.PPOConfig(
            minibatch_size=100)))
    with pytest.raises(ConfigError, match=r"kl.measure='rollout'"):
        validate(dataclasses.replace(rl.TrainConfig(), kl=rl.config.KLConfig(cadence="epoch")))
    with pytest.raises(ConfigError, match=r"kl: .*horizon"):
        validate(dataclasses.replace(rl.TrainConfig(), objective="kl_penalty",
                                     kl=rl.config.KLConfig(controller="step", horizon=10)))
    # a controller's refusal of one of its options names the config field
    with pytest.raises(ConfigError,
                       match=r"^kl\.target=-0\.01: must be finite and > 0 \(StepKL\)$"):
        validate(dataclasses.replace(rl.TrainConfig(), objective="kl_penalty",
                                     kl=rl.config.KLConfig(controller="step", target=-0.01)))
    with pytest.raises(ConfigError, match="unknown config field"):
        from_dict({"ppo": {"learning_rate": 1}})
    with pytest.raises(ConfigError, match="preset='klip/pong'"):
        rl.preset("klip/pong")
    c = from_dict({"ppo": {"lr": 1e-3}, "net": {"hidden": [32]}}, rl.preset("klip/hopper"))
    assert c.ppo.lr == 1e-3 and c.net.hidden == (32,) and c.env == "Hopper-v4"
    assert c.rollout.norm_obs and c.rollout.num_steps == 2048


def test_final_return_protocol():
    recs = [{"global_step": s, "episode_count": n, "episode_return_mean": r}
            for s, n, r in [(100, 1, 1.0), (900, 0, None), (950, 2, 10.0), (1000, 1, 40.0)]]
    assert final_return(recs) == pytest.approx((2 * 10 + 40) / 3)


def test_cli_train_yaml_flags_and_errors(tmp_path, capsys):
    from klppo.cli import main

    cfg = tmp_path / "c.yaml"
    cfg.write_text("total_steps: 1024\nppo:\n  lr: 0.001\n")
    out = tmp_path / "cli"
    assert main(["train", "--preset", "klip/cartpole", "--config", str(cfg),
                 "--ppo.update-epochs", "2", "--objective", "kl_penalty",
                 "--kl.controller", "step", "--kl.target", "0.02", "--out", str(out),
                 "--no-tensorboard"]) == 0
    import yaml

    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["total_steps"] == 1024 and saved["ppo"]["lr"] == 0.001
    assert saved["ppo"]["update_epochs"] == 2 and saved["kl"]["controller"] == "step"
    assert saved["kl"]["preset"] == "klip"
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert recs[0]["kl_target"] == 0.02 and recs[0]["beta_before"] == 1.0
    assert "final return" in capsys.readouterr().out
    assert main(["train", "--env", "CartPol-v1", "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert "did you mean CartPole-v1" in err and not (tmp_path / "bad").exists()
    # a missing extra (box2d, mujoco): tests/rl/test_presets.py


def test_ctrl_c_checkpoints_and_exits_cleanly(tmp_path):
    run = tmp_path / "int"
    proc = subprocess.Popen([sys.executable, "-m", "klppo.cli", "train", "--preset",
                             "klip/cartpole", "--total-steps", "51200", "--out", str(run),
                             "--no-tensorboard", "--checkpoint-every", "1000"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = run / "metrics.jsonl"
    wait_for_lines(metrics, 3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err  # 128 + SIGINT, as a shell reports a Ctrl-C
    assert "status: interrupted" in out and f"klppo train --resume {run}" in out
    assert "final return" not in out  # the run is not finished
    n = len(metrics.read_text().splitlines())
    assert n < 100
    ck = torch.load(run / "checkpoint.pt", weights_only=False)
    assert ck["iteration"] == n  # the checkpoint is of the last finished iteration
    assert json.loads((run / "status.json").read_text())["state"] == "interrupted"
    # the resume says where it goes on from
    done = subprocess.run([sys.executable, "-m", "klppo.cli", "train", "--resume", str(run),
                           "--total-steps", str(512 * (n + 1))], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"resuming {run} from iteration {n:,} of {n + 1:,}" in done.stdout
    assert "final return" in done.stdout


def test_tensorboard_events_when_installed(tmp_path):
    pytest.importorskip("tensorboard")
    res = rl.train(dataclasses.replace(small(tmp_path / "tb", steps=1024), tensorboard=True))
    events = list(res.run_dir.glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(res.run_dir))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    from klppo.runs.names import dashboard_scalars

    # each quantity once, under klppo's name (no CleanRL alias next to it, no kl/kl_ prefix)
    assert tags == set().union(*(dashboard_scalars(m) for m in res.metrics))
    assert {"charts/episode_return_mean", "kl/rollout", "policy/frac_kill",
            "losses/loss_critic"} <= tags
    assert "charts/episodic_return" not in tags and "kl/kl_rollout" not in tags
    ret = [e.value for e in acc.Scalars("charts/episode_return_mean")]
    assert ret == pytest.approx([m["episode_return_mean"] for m in res.metrics
                                 if m["episode_return_mean"] is not None])
    # the config as hyperparameters: the HPARAMS plugin's data and a text table
    from tensorboard.plugins.hparams import plugin_data_pb2

    content = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    lr = res.metrics[0]["lr"]  # the first iteration's lr is the configured one
    assert start.hparams["ppo.lr"].number_value == pytest.approx(lr)
    assert start.hparams["objective"].string_value == "clip"
    text = acc.Tensors("hyperparameters/text_summary")[0].tensor_proto.string_val[0].decode()
    assert f"|ppo.lr|{lr}|" in text and "|env|CartPole-v1|" in text


def test_tensorboard_with_cleanrl_names_logs_them_instead(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from klppo.runs.names import ALIASES

    cfg = dataclasses.replace(small(tmp_path / "tb", steps=1024), tensorboard=True,
                              metric_names="cleanrl")
    res = rl.train(cfg)
    acc = EventAccumulator(str(res.run_dir))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {name for name, _ in ALIASES["cleanrl"].values()} <= tags
    assert "charts/episode_return_mean" not in tags and "charts/lr" not in tags
    assert "kl/rollout" in tags  # no CleanRL name: klppo's
    assert [e.step for e in acc.Scalars("losses/approx_kl")] == \
        [m["global_step"] for m in res.metrics]


def test_a_proportional_horizon_that_could_zero_beta_in_one_update_is_refused():
    base = rl.preset("klip/cartpole")  # 512 samples per iteration, minibatches of 64
    kl = lambda **k: dataclasses.replace(base, objective="kl_penalty", kl=dataclasses.replace(
        base.kl, controller="proportional", **k))
    with pytest.raises(ConfigError, match=r"kl\.horizon=100\.0: must exceed 512 x 0\.2 = "
                                          r"102\.4 samples: one update of 512 samples"):
        rl.validate(kl(horizon=100.0))
    rl.validate(kl(horizon=103.0))
    rl.validate(kl(horizon=13.0, cadence="minibatch", measure="last_minibatch"))  # 64 x 0.2
    with pytest.raises(ConfigError, match=r"kl\.horizon=12\.0: must exceed 64 x 0\.2"):
        rl.validate(kl(horizon=12.0, cadence="minibatch", measure="last_minibatch"))
