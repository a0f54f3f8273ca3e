"""From a trained run to its use: klppo eval, klppo.load(...).predict / act, torch.export and
ONNX export, videos; on CartPole, LunarLander and Hopper (normalised observations)."""

import dataclasses
import json

import gymnasium as gym
import numpy as np
import pytest
import torch

import klppo
from klppo import rl
from klppo.cli import main

RUNS = {
    "cartpole": ("klip/cartpole", {"total_steps": 2048}, None),
    "lunarlander": ("klip/lunarlander", {"total_steps": 4096}, {"num_steps": 256}),
    "hopper": ("klip/hopper", {"total_steps": 1024}, {"num_steps": 512}),
}


#: the MuJoCo and Box2D runs in the slow suite (CI runs it); CartPole in every run
@pytest.fixture(scope="module", params=[pytest.param(n, marks=() if n == "cartpole" else
                                                     pytest.mark.slow) for n in RUNS])
def run(request, tmp_path_factory):
    name = request.param
    pytest.importorskip({"lunarlander": "Box2D", "hopper": "mujoco"}.get(name, "gymnasium"))
    preset, top, rollout = RUNS[name]
    cfg = rl.preset(preset)
    cfg = dataclasses.replace(cfg, tensorboard=False, out=str(tmp_path_factory.mktemp(name) /
                                                              "run"), **top)
    if rollout:
        cfg.rollout = dataclasses.replace(cfg.rollout, **rollout)
    return rl.train(cfg).run_dir


def observations(env_id, n=16, seed=3):
    env = gym.make(env_id)
    obs, _ = env.reset(seed=seed)
    out = []
    for _ in range(n):
        out.append(obs)
        obs, _, term, trunc, _ = env.step(env.action_space.sample())
        if term or trunc:
            obs, _ = env.reset()
    env.close()
    return np.stack(out)


def test_eval_writes_eval_json_and_is_repeatable(run, capsys):
    for old in run.glob("eval*.json"):
        old.unlink()
    assert main(["eval", str(run), "--episodes", "2"]) == 0
    out = capsys.readouterr().out
    first = json.loads((run / "eval.json").read_text())
    assert first["episodes"] == 2 and len(first["returns"]) == 2 and first["deterministic"]
    assert f"2 episodes (deterministic actions, seeds 1000000..1000001): return " \
           f"{first['mean']:.2f} +- {first['std']:.2f}" in out
    assert f"written: {run / 'eval.json'}" in out
    # a second evaluation never overwrites the first: it goes to eval-2.json, and says so
    assert main(["eval", str(run), "--episodes", "2"]) == 0
    assert f"written: {run / 'eval-2.json'}" in capsys.readouterr().out
    assert json.loads((run / "eval-2.json").read_text())["returns"] == first["returns"]
    assert json.loads((run / "eval.json").read_text()) == first
    assert main(["eval", str(run), "--episodes", "1", "--stochastic", "--seed", "5"]) == 0
    out = capsys.readouterr().out
    assert "1 episode (sampled actions, seed 5): return" in out and "episodes" not in out
    assert json.loads((run / "eval-3.json").read_text())["deterministic"] is False
    # --force overwrites eval.json itself
    assert main(["eval", str(run), "--episodes", "1", "--force"]) == 0
    assert json.loads((run / "eval.json").read_text())["episodes"] == 1
    assert sorted(p.name for p in run.glob("eval*.json")) == ["eval-2.json", "eval-3.json",
                                                              "eval.json"]


def test_load_predict_single_and_batched_with_frozen_normalisation(run):
    policy = klppo.load(run)
    obs = observations(policy.config.env)
    batch, state = policy.predict(obs, deterministic=True)
    assert state is None and len(batch) == len(obs)
    single, _ = policy.predict(obs[0], deterministic=True)
    assert np.shape(single) == np.shape(batch[0])  # a single observation: a single action
    assert np.allclose(single, batch[0], rtol=1e-6, atol=1e-7)  # BLAS: batch 1 vs 16 (ulps)
    assert np.array_equal(policy.act(obs), batch)
    stats = None if policy.obs_norm is None else policy.obs_norm.rms.state_dict()
    with torch.no_grad():  # by hand: the frozen normalisation, then the actor's mode
        x = np.asarray(obs, np.float32)
        if stats is not None:
            x = np.clip((x - stats["mean"]) / np.sqrt(stats["var"] + 1e-8), -10, 10)
            x = x.astype(np.float32)
        params = policy.agent.policy_params(torch.from_numpy(x))
    if policy.discrete:
        expect = params.argmax(-1).numpy()
    else:
        space = policy.action_space
        expect = np.clip(params[:, : space.shape[0]].numpy(), space.low, space.high)
    assert np.array_equal(batch, expect)
    if stats is not None:  # predicting does not update the statistics
        after = policy.obs_norm.rms.state_dict()
        assert np.array_equal(after["mean"], stats["mean"]) and after["count"] == stats["count"]
    assert (policy.obs_norm is not None) == policy.config.rollout.norm_obs


def test_predict_samples_by_default_as_stable_baselines3_does(run):
    """SB3's predict(observation, state=None, episode_start=None, deterministic=False): a
    sample unless deterministic=True; the sample is act(..., deterministic=False) under
    torch's global generator."""
    import inspect

    policy = klppo.load(run)
    sig = inspect.signature(policy.predict)
    assert list(sig.parameters) == ["observation", "state", "episode_start", "deterministic"]
    assert sig.parameters["deterministic"].default is False
    obs = observations(policy.config.env, n=64)
    mode = policy.act(obs)
    torch.manual_seed(7)
    sampled, _ = policy.predict(obs)
    torch.manual_seed(7)
    assert np.array_equal(sampled, policy.act(obs, deterministic=False))
    assert not np.array_equal(sampled, mode)  # a barely trained policy: samples differ
    assert np.array_equal(policy.predict(obs, deterministic=True)[0], mode)


def test_torch_export_gives_the_same_actions(run, tmp_path):
    policy = klppo.load(run)
    path = policy.export(tmp_path / "policy.pt2")
    module = torch.export.load(str(path)).module()
    for n in (64, 1, 3):  # any batch size
        obs = observations(policy.config.env, n=n)
        exported = module(torch.as_tensor(obs, dtype=torch.float32)).numpy()
        assert np.array_equal(exported, policy.act(obs))


def test_onnx_export_gives_the_same_actions(run, tmp_path):
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    policy = klppo.load(run)
    path = policy.export(tmp_path / "policy.onnx")
    session = ort.InferenceSession(str(path))
    for n in (64, 1):
        obs = observations(policy.config.env, n=n).astype(np.float32)
        (exported,) = session.run(None, {"obs": obs})
        expect = policy.act(obs)
        if policy.discrete:
            assert np.array_equal(exported, expect)
        else:  # onnxruntime's kernels round differently from torch's (a few ulps)
            assert np.allclose(exported, expect, rtol=1e-5, atol=1e-6)


def test_onnx_export_prints_nothing_of_torchs(run, tmp_path):
    """torch's exporter logged a line per torchvision operator and a pytree FutureWarning."""
    import subprocess
    import sys

    pytest.importorskip("onnxscript")
    code = (f"import klppo; klppo.load({str(run)!r}).export({str(tmp_path / 'q.onnx')!r})")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stderr == "" and done.stdout == "", done.stderr[-800:]
    assert (tmp_path / "q.onnx").stat().st_size > 0


def test_onnx_without_the_packages_is_one_named_error(run, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "onnxscript", None)  # import fails as if not installed
    with pytest.raises(ImportError, match=r"pip install -c constraints.txt -e '\.\[onnx\]'"):
        klppo.load(run).export(tmp_path / "p.onnx")
    assert not (tmp_path / "p.onnx").exists()


def test_video_where_rendering_is_available(tmp_path, run, capsys):
    pytest.importorskip("moviepy")
    code = main(["eval", str(run), "--episodes", "1", "--video", str(tmp_path / "v")])
    err = capsys.readouterr().err
    if code != 0:  # rendering unavailable here: a one-line reason, no traceback
        assert "cannot render" in err and "Traceback" not in err
        pytest.skip(err.strip())
    videos = list((tmp_path / "v").glob("*.mp4"))
    assert videos and videos[0].stat().st_size > 0


def test_a_video_is_recorded_without_sdls_display_noise(tmp_path, run):
    """Classic-control frames come from pygame's SDL; headless, its default driver printed
    "error: XDG_RUNTIME_DIR is invalid" (from C, so a subprocess sees it) on every run."""
    import os
    import subprocess
    import sys

    pytest.importorskip("moviepy")
    env = {k: v for k, v in os.environ.items()
           if k not in ("XDG_RUNTIME_DIR", "SDL_VIDEODRIVER", "SDL_AUDIODRIVER", "DISPLAY")}
    out = subprocess.run([sys.executable, "-m", "klppo", "eval", str(run), "--episodes", "1",
                          "--video", str(tmp_path / "v")], env=env, capture_output=True,
                         text=True, timeout=300)
    if out.returncode != 0:
        pytest.skip(out.stderr.strip())
    assert "XDG_RUNTIME_DIR" not in out.stderr and "error" not in out.stderr.lower()
    assert list((tmp_path / "v").glob("*.mp4"))


def test_eval_bad_input_is_one_line(tmp_path, capsys):
    assert main(["eval", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("klppo eval: ") and "no such directory" in err
    assert len(err.splitlines()) == 1
