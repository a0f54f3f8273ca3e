"""Single-agent env arguments (`--env-kwargs`, `env_kwargs:` in a config; recorded, validated,
used by eval and load) and extending a run (`klppo train --resume DIR --total-steps N`: the
learning rate goes on from where it was, never jumps; exact across a failure and a resume)."""

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import yaml

from klppo import rl
from klppo.rl.lr_schedule import learning_rate
from klppo.rl.trainer import TIMING_KEYS
from klppo.runs.errors import ConfigError
from tests.badinput import assert_one_line_error, run_main, tree

COUNTER = "tests.rl.envs_for_tests:KlppoTest/Counter-v0"  # reward 1 per step, `limit` steps


def metrics(run_dir):
    rows = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows]


# ------------------------------------------------------------------------------ env kwargs
def test_env_kwargs_reach_the_env_are_recorded_and_used_by_eval(tmp_path, capsys):
    out = tmp_path / "run"
    assert run_main(["train", "--env", COUNTER, "--env-kwargs", '{"limit": 7}',
                     "--total-steps", "512", "--no-tensorboard", "--out", str(out)]) == 0
    assert yaml.safe_load((out / "config.yaml").read_text())["env_kwargs"] == {"limit": 7}
    last = metrics(out)[-1]
    assert last["episode_length_mean"] == 7.0 and last["episode_return_mean"] == 7.0
    assert run_main(["eval", str(out), "--episodes", "2"]) == 0
    assert json.loads((out / "eval.json").read_text())["returns"] == [7.0, 7.0]
    capsys.readouterr()


def test_env_kwargs_from_a_config_file_are_checkpointed_and_resumed(tmp_path):
    import torch

    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(f"env: {COUNTER}\nenv_kwargs:\n  limit: 4\ntotal_steps: 1536\n"
                        f"checkpoint_every: 1\ntensorboard: false\n")
    out = tmp_path / "run"
    assert run_main(["train", "--config", str(cfg_file), "--out", str(out)]) == 0
    full = metrics(out)
    assert full[-1]["episode_length_mean"] == 4.0
    state = torch.load(out / "checkpoint.pt", weights_only=False)
    assert state["config"]["env_kwargs"] == {"limit": 4}

    def fail_at_2(m):
        if m["iteration"] == 2:
            raise RuntimeError("boom")

    cfg = rl.validate(rl.config.from_dict({"env": COUNTER, "env_kwargs": {"limit": 4},
                                           "total_steps": 1536, "checkpoint_every": 1,
                                           "tensorboard": False, "out": str(tmp_path / "b")}))
    with pytest.raises(rl.TrainingError):
        rl.train(cfg, on_iteration=fail_at_2)
    assert rl.resume(tmp_path / "b").status == "finished"
    assert metrics(tmp_path / "b") == full


def test_cartpole_with_env_kwargs_takes_the_general_vector_env(tmp_path):
    """CartPole's numpy vector env would not see the kwargs: with them, klppo steps gym.make
    envs (sutton_barto_reward: 0 per step, -1 at the end, so every return is -1 or 0)."""
    cfg = dataclasses.replace(rl.preset("klip/cartpole"), total_steps=1024, tensorboard=False,
                              out=str(tmp_path / "r"), env_kwargs={"sutton_barto_reward": True})
    res = rl.train(cfg)
    assert all(-1.0 <= m["episode_return_mean"] <= 0.0 for m in res.metrics
               if m["episode_return_mean"] is not None)


BAD = [
    ("unknown-argument", ["--env", COUNTER, "--env-kwargs", "{nope: 1}"],
     ["env_kwargs={'nope': 1}: KlppoTest/Counter-v0 does not take them", "nope"]),
    ("not-a-mapping", ["--env-kwargs", "[1, 2]"], ["--env-kwargs='[1, 2]': must be a mapping"]),
    ("not-yaml", ["--env-kwargs", "{a: [}"], ["--env-kwargs='{a: [}'", "not valid YAML"]),
    ("a-key-not-a-name", ["--env-kwargs", "{1: 2}"],
     ["env_kwargs={1: 2}: must be a mapping of names to values"]),
    ("given-twice", ["--env-kwargs", "{}", "--env-kwargs", "{}"],
     ["argument --env-kwargs", "given twice"]),
    ("multi-agent", ["--preset", "marl/simple_adversary", "--env-kwargs", "{max_cycles: 5}"],
     ["env_kwargs={'max_cycles': 5}", "marl.env_kwargs"]),
    ("with-resume", ["--resume", "{tmp}", "--env-kwargs", "{}"],
     ["--resume takes no other flags but --total-steps N"]),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_env_kwargs_are_one_line_before_any_directory(case, tmp_path, capsys):
    _, flags, needles = case
    if "marl/simple_adversary" in flags:
        pytest.importorskip("mpe2")
    flags = [str(tmp_path) if f == "{tmp}" else f for f in flags]
    argv = ["train", *flags, "--total-steps", "512", "--out", str(tmp_path / "r")]
    if "--resume" in flags:
        argv = ["train", *flags]
    before = tree(tmp_path)
    assert_one_line_error(run_main(argv), capsys.readouterr().err, 2, "train", needles)
    assert tree(tmp_path) == before


def test_env_kwargs_in_a_config_file_are_type_checked(tmp_path, capsys):
    bad = tmp_path / "c.yaml"
    bad.write_text("env_kwargs: 3\n")
    rc = run_main(["train", "--config", str(bad), "--out", str(tmp_path / "r")])
    assert_one_line_error(rc, capsys.readouterr().err, 2, "train",
                          ["env_kwargs=3: must be a mapping of names to values"])
    with pytest.raises(ConfigError, match="env_kwargs.f=.*must be plain data"):
        rl.validate(dataclasses.replace(rl.TrainConfig(), env_kwargs={"f": object()}))


# --------------------------------------------------------------------------- extending a run
def _cartpole(out: Path, total: int = 2048, **kw) -> rl.TrainConfig:
    cfg = rl.preset("klip/cartpole")  # 512 steps per iteration
    return dataclasses.replace(cfg, total_steps=total, tensorboard=False, out=str(out),
                               checkpoint_every=1, **kw)


def test_extending_a_finished_run_replans_the_learning_rate_over_the_new_total(tmp_path,
                                                                                capsys):
    """The default, as SB3's learn(reset_num_timesteps=False): the iterations to come get the
    rates of a schedule over the new total (iteration 5 of 8: 1 - 4/8 of ppo.lr), not the
    finished run's last rate (it learned at lr / 4 there, and a 100-iteration run at lr / 100)."""
    run = tmp_path / "run"
    first = rl.train(_cartpole(run)).metrics
    assert run_main(["train", "--resume", str(run), "--total-steps", "4096"]) == 0
    rows = metrics(run)
    assert rows[:4] == [{k: v for k, v in m.items() if k not in TIMING_KEYS} for m in first]
    lr = 3e-4
    assert [m["lr"] for m in rows] == pytest.approx(
        [lr, 0.75 * lr, 0.5 * lr, 0.25 * lr] + [lr * (1 - (i - 1) / 8) for i in range(5, 9)])
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["lr_anneal_from"] == [4.0, 0.5]
    assert rl.resume(run).status == "finished"


def test_extending_with_lr_plan_continue_goes_on_without_a_jump(tmp_path, capsys):
    run = tmp_path / "run"
    first = rl.train(_cartpole(run)).metrics
    assert [m["lr"] for m in first] == pytest.approx([3e-4, 2.25e-4, 1.5e-4, 7.5e-5])
    assert run_main(["train", "--resume", str(run), "--total-steps", "4096",
                     "--lr-plan", "continue"]) == 0
    assert "status: finished" in capsys.readouterr().out
    rows = metrics(run)
    assert [m["iteration"] for m in rows] == list(range(1, 9))
    assert rows[:4] == [{k: v for k, v in m.items() if k not in TIMING_KEYS} for m in first]
    # by hand: iteration 5 keeps iteration 4's rate, then it falls linearly to 7.5e-5 / 4
    assert [m["lr"] for m in rows] == pytest.approx(
        [3e-4, 2.25e-4, 1.5e-4, 7.5e-5, 7.5e-5, 5.625e-5, 3.75e-5, 1.875e-5])
    lrs = [m["lr"] for m in rows]
    assert all(b <= a for a, b in zip(lrs, lrs[1:]))  # never up, so no jump
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["total_steps"] == 4096 and cfg["lr_anneal_from"] == [4.0, 0.25]
    meta = json.loads((run / "metadata.json").read_text())
    assert meta["resumes"][-1]["extended"] == {"total_steps": [2048, 4096]}
    assert rl.resume(run).status == "finished"  # the files agree with each other again


def test_extending_twice_anneals_piece_by_piece(tmp_path):
    run = tmp_path / "run"
    rl.train(_cartpole(run))
    rl.resume(run, total_steps=3072, lr_plan="continue")   # iterations 5-6 from 7.5e-5
    rl.resume(run, total_steps=4096, lr_plan="continue")   # 7-8 from iteration 6's rate
    lrs = [m["lr"] for m in metrics(run)]
    i6 = 7.5e-5 * (1 - 1 / 2)
    assert lrs == pytest.approx([3e-4, 2.25e-4, 1.5e-4, 7.5e-5, 7.5e-5, i6, i6, i6 / 2])


def test_an_extended_run_is_exact_across_a_failure_and_a_resume(tmp_path):
    base = tmp_path / "base"
    rl.train(_cartpole(base))
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    shutil.copytree(base, whole)
    shutil.copytree(base, broken)
    rl.resume(whole, total_steps=4096)

    def fail_at_6(m):
        if m["iteration"] == 6:
            raise RuntimeError("boom")

    with pytest.raises(rl.TrainingError, match="boom"):
        rl.resume(broken, total_steps=4096, on_iteration=fail_at_6)
    assert rl.resume(broken).status == "finished"  # a plain resume goes on with the new total
    assert metrics(broken) == metrics(whole)


def test_extending_an_unannealed_run_keeps_its_rate(tmp_path):
    run = tmp_path / "run"
    cfg = _cartpole(run)
    rl.train(dataclasses.replace(cfg, ppo=dataclasses.replace(cfg.ppo, anneal_lr=False)))
    rl.resume(run, total_steps=3072)
    assert {m["lr"] for m in metrics(run)} == {3e-4}
    assert yaml.safe_load((run / "config.yaml").read_text())["lr_anneal_from"] is None


def test_a_new_total_that_adds_nothing_is_refused_and_changes_nothing(tmp_path, capsys):
    run = tmp_path / "run"
    rl.train(_cartpole(run))
    files = {p: (run / p).read_bytes() for p in ("config.yaml", "checkpoint.pt",
                                                 "status.json", "metadata.json")}
    for total, needle in (("2048", "the run has already done 4 iterations (2,048 steps)"),
                          ("100", "is less than one rollout"),
                          ("many", "invalid int value: 'many'")):
        rc = run_main(["train", "--resume", str(run), "--total-steps", total])
        assert_one_line_error(rc, capsys.readouterr().err, 2, "train", [needle])
    assert {p: (run / p).read_bytes() for p in files} == files


def test_editing_total_steps_by_hand_is_refused_and_points_to_the_flag(tmp_path, capsys):
    run = tmp_path / "run"
    rl.train(_cartpole(run))
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["total_steps"] = 4096
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    rc = run_main(["train", "--resume", str(run)])
    assert_one_line_error(rc, capsys.readouterr().err, 2, "train",
                          ["total_steps=4096 but the checkpoint was made with 2048",
                           "klppo train --resume DIR --total-steps N"])


def test_learning_rate_schedule_by_hand():
    cfg = dataclasses.replace(rl.preset("klip/cartpole"), total_steps=512 * 10)
    assert [learning_rate(cfg, it) for it in (1, 10)] == pytest.approx([3e-4, 3e-5])
    ext = dataclasses.replace(cfg, total_steps=512 * 20, lr_anneal_from=(10.0, 0.1))
    assert [learning_rate(ext, it) for it in (10, 11, 15, 20)] == pytest.approx(
        [3e-5, 3e-5, 3e-5 * (1 - 4 / 10), 3e-5 * (1 - 9 / 10)])
    for bad in ((10.0,), (0.0, 0.5), (20.0, 0.5), (3.5, 0.5), (5.0, 0.0), (5.0, 1.5)):
        with pytest.raises(ConfigError, match="lr_anneal_from"):
            rl.validate(dataclasses.replace(ext, lr_anneal_from=bad))


def test_gymnasium_s_out_of_date_warning_comes_once_per_id(monkeypatch):
    # the KLip-PPO presets run MuJoCo v4 on purpose; gymnasium warned at both makes of a run
    import warnings

    pytest.importorskip("mujoco")
    from klppo.rl import envs

    monkeypatch.setattr(envs, "_SAID_OUT_OF_DATE", set())
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):
            envs.make_env("Hopper-v4").close()
    said = [w for w in seen if "is out of date" in str(w.message)]
    assert len(said) == 1 and "Hopper-v4" in str(said[0].message)
