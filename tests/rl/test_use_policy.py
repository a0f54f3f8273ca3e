"""Using a trained policy without the training setup: the spaces saved in the run (spaces.json)
so `klppo.load` needs no env, old runs without it, `klppo.load` on a checkpoint.pt path,
`klppo eval` on a sweep directory (each run, `--run NAME`, one `--out` file), and a user's env
module found from the working directory by the `klppo` command."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import klppo
from klppo import rl
from klppo.rl.spaces import read_spaces, space_from_json, space_to_json, write_spaces
from klppo.runs.errors import CheckpointError, UserInputError
from tests.badinput import assert_one_line_error, run_main

ROOT = Path(__file__).resolve().parents[2]

#: a user's env module, registered on import (in a file of its own: a temporary directory)
USER_ENV = '''
import gymnasium as gym
import numpy as np


class Tiny(gym.Env):
    observation_space = gym.spaces.Box(-2.0, 2.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(3)

    def __init__(self, length=5):
        self.length = length

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.uniform(-1, 1, 3).astype(np.float32), {}

    def step(self, action):
        self.t += 1
        obs = self.np_random.uniform(-1, 1, 3).astype(np.float32)
        return obs, float(action == 1), self.t >= self.length, False, {}


gym.register("KlppoUserTiny-v0", entry_point=Tiny)
'''


def _train(out: Path, **kw) -> Path:
    cfg = dataclasses.replace(rl.preset("klip/cartpole"), tensorboard=False, out=str(out),
                              total_steps=1024, **kw)
    return rl.train(cfg).run_dir


@pytest.fixture(scope="module")
def cartpole(tmp_path_factory):
    return _train(tmp_path_factory.mktemp("use") / "run")


# ------------------------------------------------------------------------- spaces as data
@pytest.mark.parametrize("space", [
    gym.spaces.Discrete(4), gym.spaces.Discrete(3, start=0),
    gym.spaces.Box(-1.0, 1.0, (2, 3), np.float32),
    gym.spaces.Box(np.array([-np.inf, 0.0]), np.array([np.inf, 5.5]), dtype=np.float64),
    gym.spaces.Box(0, 255, (4,), np.uint8),
])
def test_a_space_survives_json(space):
    text = json.dumps(space_to_json(space), allow_nan=False)  # strict JSON: no Infinity
    back = space_from_json(json.loads(text), "here")
    assert back == space and back.dtype == space.dtype


def test_a_run_records_its_spaces_as_json(cartpole):
    data = json.loads((cartpole / "spaces.json").read_text())
    assert data["action"] == {"type": "Discrete", "n": 2, "start": 0}
    assert data["observation"]["shape"] == [4] and "-inf" in data["observation"]["low"]
    env = gym.make("CartPole-v1")
    assert read_spaces(cartpole) == {"observation": env.observation_space,
                                     "action": env.action_space}


@pytest.mark.parametrize("text, needle", [
    ("[1, 2]", "not a mapping"),
    ("{\"observation\": {\"type\": \"Dict\"}, \"action\": {}}", "not a Box or Discrete"),
    ("{\"observation\": {\"type\": \"Box\", \"shape\": [2], \"dtype\": \"float32\", "
     "\"low\": [0], \"high\": [1, 1]}, \"action\": {\"type\": \"Discrete\", \"n\": 2}}",
     "a bound must be a list of 2 numbers"),
    ("{\"observation\": {\"type\": \"Box\", \"shape\": [1], \"dtype\": \"object\", "
     "\"low\": [0], \"high\": [1]}}", "dtype 'object'"),
    ("not json", "unreadable"),
])
def test_a_damaged_spaces_file_is_one_named_error(tmp_path, cartpole, text, needle):
    run = tmp_path / "run"
    shutil.copytree(cartpole, run)
    (run / "spaces.json").write_text(text)
    with pytest.raises(CheckpointError, match="spaces.json") as e:
        klppo.load(run)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_load_needs_no_env_and_an_old_run_makes_it(tmp_path, cartpole, monkeypatch):
    """With spaces.json no env is made (gym.make fails here); a run written before it existed
    (no spaces.json) makes the env and gives the same policy."""
    obs = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)
    expect = klppo.load(cartpole).act(obs)
    old = tmp_path / "old"
    shutil.copytree(cartpole, old)
    (old / "spaces.json").unlink()
    assert np.array_equal(klppo.load(old).act(obs), expect)

    def no_env(*a, **k):
        raise AssertionError("an env was made")

    monkeypatch.setattr(gym, "make", no_env)
    assert np.array_equal(klppo.load(cartpole).act(obs), expect)
    with pytest.raises(UserInputError, match="an env was made"):  # (named as the env's error)
        klppo.load(old)


def test_load_takes_the_checkpoint_path_and_names_the_run_directory(tmp_path, cartpole):
    obs = np.zeros((2, 4), np.float32)
    assert np.array_equal(klppo.load(cartpole / "checkpoint.pt").act(obs),
                          klppo.load(cartpole).act(obs))
    with pytest.raises(UserInputError) as e:
        klppo.load(cartpole / "config.yaml")
    assert str(e.value) == (f"run_dir={str(cartpole / 'config.yaml')!r}: a file, not a run "
                            f"directory (give the run directory, or its checkpoint.pt)")
    for path, needle in ((tmp_path / "nope", "no such directory"),
                         (tmp_path, "not a klppo run directory (no config.yaml)")):
        with pytest.raises(UserInputError) as e:
            klppo.load(path)
        assert str(e.value).startswith(f"run_dir={str(path)!r}: {needle}"), str(e.value)
        assert "resume" not in str(e.value)
    fresh = tmp_path / "fresh"
    shutil.copytree(cartpole, fresh)
    (fresh / "checkpoint.pt").unlink()
    with pytest.raises(UserInputError, match="no checkpoint.pt yet"):
        klppo.load(fresh)


def test_a_multiagent_run_loads_from_its_spaces(tmp_path):
    pytest.importorskip("mpe2")
    cfg = rl.preset("marl/simple_adversary")
    cfg = dataclasses.replace(cfg, tensorboard=False, out=str(tmp_path / "m"), total_steps=400,
                              rollout=dataclasses.replace(cfg.rollout, num_steps=50))
    run = rl.train(cfg).run_dir
    saved = json.loads((run / "spaces.json").read_text())["policies"]
    assert set(saved) == {"adversary", "agent"} and saved["adversary"]["agents"] == ["adversary_0"]
    from klppo.rl.policy import load_policies

    with_file = load_policies(run)
    (run / "spaces.json").unlink()  # a run from before: the env is made
    made = load_policies(run)
    for p, pol in with_file.items():
        obs = np.random.default_rng(1).normal(size=(8, pol.obs_dim)).astype(np.float32)
        assert np.array_equal(pol.act(obs), made[p].act(obs))
        assert pol.config == made[p].config


def test_write_spaces_refuses_what_it_cannot_read_back(tmp_path):
    with pytest.raises(ValueError, match="only Box and Discrete"):
        write_spaces(tmp_path, gym.spaces.MultiBinary(3), gym.spaces.Discrete(2))


# --------------------------------------------------------------------- eval of a sweep
@pytest.fixture
def sweep(tmp_path, cartpole):
    """A sweep directory's layout: two finished runs and one not started."""
    root = tmp_path / "sweep"
    for name in ("a", "b"):
        shutil.copytree(cartpole, root / "runs" / name)
    (root / "runs" / "c").mkdir()
    shutil.copy(cartpole / "config.yaml", root / "runs" / "c" / "config.yaml")
    (root / "index.json").write_text(json.dumps({"runs": []}))
    return root


def test_eval_of_a_sweep_evaluates_each_run(sweep, capsys):
    assert run_main(["eval", str(sweep), "--episodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "skipped c: no checkpoint yet" in out
    assert out.count("2 episodes (deterministic actions") == 2
    for name in ("a", "b"):
        assert f"{name}:\n" in out and f"written: {sweep / 'runs' / name / 'eval.json'}" in out
    a, b = (json.loads((sweep / "runs" / n / "eval.json").read_text()) for n in "ab")
    assert a == b  # the same policy, the same seeds


def test_eval_of_one_run_of_a_sweep_and_all_in_one_file(sweep, tmp_path, capsys):
    assert run_main(["eval", str(sweep), "--episodes", "1", "--run", "b"]) == 0
    assert (sweep / "runs" / "b" / "eval.json").exists()
    assert not (sweep / "runs" / "a" / "eval.json").exists()
    capsys.readouterr()
    out = tmp_path / "all.json"
    assert run_main(["eval", str(sweep), "--episodes", "1", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert sorted(data["runs"]) == ["a", "b"] and data["runs"]["a"]["episodes"] == 1
    assert not (sweep / "runs" / "a" / "eval.json").exists()  # all went to --out
    assert run_main(["eval", str(sweep), "--episodes", "1", "--out", str(out)]) == 2
    assert "exists; --force" in capsys.readouterr().err
    assert run_main(["eval", str(sweep), "--run", "zz"]) == 2
    assert_one_line_error(2, capsys.readouterr().err, 2, "eval",
                          ["--run zz: not a run of", "its runs: a, b, c"])


# ------------------------------------------------------ a user's env module, from the cwd
def _klppo(args: list[str], cwd: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """``klppo ARGS`` as the installed script runs it: sys.path starts at the script's folder,
    not at the working directory (unlike ``python -m``)."""
    script = tmp_path / "bin" / "klppo"
    script.parent.mkdir(exist_ok=True)
    script.write_text("import sys\nfrom klppo.cli import main\nsys.exit(main())\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(script), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env=env)


def test_a_user_env_module_is_found_from_the_working_directory(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "klppo_user_tiny.py").write_text(USER_ENV)
    env_id = "klppo_user_tiny:KlppoUserTiny-v0"
    proc = _klppo(["train", "--env", env_id, "--total-steps", "512", "--no-tensorboard",
                   "--env-kwargs", "{length: 3}", "--out", "run"], work, tmp_path)
    assert proc.returncode == 0, proc.stderr
    run = work / "run"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["episode_length_mean"] == 3.0  # the env kwargs reached the env
    proc = _klppo(["eval", "run", "--episodes", "2"], work, tmp_path)
    assert proc.returncode == 0 and "2 episodes" in proc.stdout, proc.stderr
    assert json.loads((run / "eval.json").read_text())["lengths"] == [3, 3]
    # elsewhere, where the module cannot be imported: loading needs only the run directory
    code = ("import importlib.util, sys, numpy as np, klppo\n"
            "assert importlib.util.find_spec('klppo_user_tiny') is None\n"
            f"p = klppo.load({str(run)!r})\n"
            "a, _ = p.predict(np.zeros(3, np.float32), deterministic=True)\n"
            "print('action', int(a), p.action_space)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "action" in proc.stdout and "Discrete(3)" in proc.stdout
    (run / "spaces.json").unlink()  # without the file the env is needed, and named
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode != 0 and "cannot import module 'klppo_user_tiny'" in proc.stderr


def test_the_working_directory_goes_last_and_only_for_the_command(tmp_path, monkeypatch):
    from klppo.cli import find_modules_in_cwd

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    before = list(sys.path)
    assert find_modules_in_cwd() == str(tmp_path) and sys.path == [*before, str(tmp_path)]
    assert find_modules_in_cwd() is None  # once
    monkeypatch.setattr(sys, "path", list(before))
    assert run_main(["verify", "--help"]) == 0 and sys.path == before  # given back


def test_loading_a_missing_run_is_a_file_not_found_error(tmp_path):
    """As Stable-Baselines3's load of a missing file: a FileNotFoundError (klppo's one-line
    input error too, so the CLI still says it in one line)."""
    import klppo
    from klppo.runs.errors import UserInputError

    with pytest.raises(FileNotFoundError, match=r"run_dir='.*nope': no such directory") as e:
        klppo.load(tmp_path / "nope")
    assert isinstance(e.value, UserInputError)
