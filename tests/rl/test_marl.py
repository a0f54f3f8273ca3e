"""Multi-agent PPO on PettingZoo (issue #11): one learner and one KL controller per policy.

The RLlib seed's situation: MPE simple_adversary with the adversary and the good agents as two
policies, each with RLlib's KL-coefficient rule on its own sampled KL. (Exact SIGKILL-resume of
both multi-agent presets is in tests/rl/test_resume.py.)
"""

import dataclasses
import json
import logging

import numpy as np
import pytest

from klppo import rl
from klppo.cli import main
from klppo.rl.trainer import TIMING_KEYS
from tests.core.test_controllers import rllib_reference  # RLlib's update_kl, written out

pytest.importorskip("mpe2")

GOOD = ["--preset", "marl/simple_adversary", "--total-steps", "4000", "--rollout.num-steps",
        "50", "--no-tensorboard"]


def short(tmp_path, name="r", **over):
    cfg = rl.preset("marl/simple_adversary")
    cfg = dataclasses.replace(cfg, total_steps=over.pop("total_steps", 8000),
                              out=str(tmp_path / name), tensorboard=False)
    cfg.rollout.num_steps = 50
    for k, v in over.items():
        setattr(cfg.marl, k, v) if k in ("overrides", "policies") else setattr(cfg, k, v)
    return cfg


def records(res):
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in res.metrics]


def test_rllib_rule_replayed_on_each_policys_kl_gives_its_beta_trajectory(tmp_path):
    """Each policy's beta is RLlib's rule applied to that policy's logged KL, exactly; with
    different targets the two trajectories differ (they evolve independently)."""
    targets = {"adversary": 0.004, "agent": 0.02}
    res = rl.train(short(tmp_path, total_steps=12000, overrides=tuple(
        f"{p}:kl.target={t}" for p, t in targets.items())))
    m = res.metrics
    assert res.policies == ["adversary", "agent"]
    betas = {}
    for p, target in targets.items():
        kls = [r[f"{p}/kl_observed"] for r in m]
        betas[p] = [r[f"{p}/beta_after"] for r in m]
        assert betas[p] == rllib_reference(kls, kl_target=target)
        assert [r[f"{p}/kl_target"] for r in m] == [target] * len(m)
        assert [r[f"{p}/beta"] for r in m] == betas[p]
        assert len(set(betas[p])) > 2, f"{p}'s beta never moved: {betas[p]}"
    assert betas["adversary"] != betas["agent"]
    # each trajectory is its own KL's: the other policy's KL replays to another one
    assert rllib_reference([r["agent/kl_observed"] for r in m],
                          kl_target=targets["adversary"]) != betas["adversary"]


def test_a_fixed_beta_policy_beside_an_adaptive_one(tmp_path):
    """Controllers and objectives are per policy: a fixed-beta kl_penalty adversary keeps its
    beta while the clip_kl good agents adapt theirs."""
    res = rl.train(short(tmp_path, overrides=(
        "adversary:objective=kl_penalty", "adversary:kl.controller=fixed",
        "adversary:kl.beta=0.5")))
    assert {r["adversary/beta"] for r in res.metrics} == {0.5}
    assert len({r["agent/beta"] for r in res.metrics}) > 1
    assert "adversary/controller_updates" in res.metrics[0]


def test_metrics_are_prefixed_per_policy_and_global_step_counts_env_steps(tmp_path):
    cfg = short(tmp_path)
    res = rl.train(cfg)
    first = res.metrics[0]
    assert first["global_step"] == cfg.rollout.num_envs * cfg.rollout.num_steps
    for p in ("adversary", "agent"):
        for k in ("beta", "kl_rollout", "episode_return_mean", "frac_kill", "value_loss", "lr"):
            assert f"{p}/{k}" in first, k
    assert "beta" not in first and "episode_return_mean" not in first
    assert first["episode_length_mean"] == 25.0  # MPE's max_cycles
    assert first["episode_count"] == cfg.rollout.num_envs * 2  # 50 steps = two episodes each


def test_every_policy_anneals_its_learning_rate_over_the_whole_run(tmp_path):
    """Each policy's schedule is the run's, whatever its number of agents (a policy sized in its
    own samples once reached lr 0 half-way and then went negative)."""
    cfg = short(tmp_path, total_steps=4000)
    res = rl.train(cfg)
    n = cfg.num_iterations
    for p in ("adversary", "agent"):
        lrs = [r[f"{p}/lr"] for r in res.metrics]
        assert lrs == [cfg.ppo.lr * (1 - i / n) for i in range(n)]
    assert min(lrs) > 0


def test_same_seed_same_metrics_other_seed_others(tmp_path):
    a = records(rl.train(short(tmp_path, "a")))
    b = records(rl.train(short(tmp_path, "b")))
    c = records(rl.train(short(tmp_path, "c", seed=1)))
    assert a == b
    assert a != c


def test_every_policy_uses_the_fast_path_or_says_why_not(tmp_path, caplog):
    from klppo.rl.marl.trainer import MultiTrainer

    tr = MultiTrainer.alone(short(tmp_path), tmp_path)
    assert all(u.fast for u in tr.units.values())
    caplog.set_level(logging.WARNING)
    cfg = short(tmp_path, overrides=("agent:net.shared_trunk=true",))
    tr = MultiTrainer.alone(cfg, tmp_path)
    assert tr.units["adversary"].fast and not tr.units["agent"].fast
    assert "numpy fast path off" in caplog.text


def test_agents_of_one_policy_share_one_network_and_fill_its_columns(tmp_path):
    from klppo.rl.marl.trainer import MultiTrainer

    cfg = short(tmp_path)
    tr = MultiTrainer.alone(cfg, tmp_path)
    tr.start()
    tr.collector.collect(1)
    n = cfg.rollout.num_envs
    assert tr.collector.slots["agent"].buf.obs.shape == (50, 2 * n, 10)
    assert tr.collector.slots["adversary"].buf.obs.shape == (50, n, 8)
    # every episode of MPE is truncated at 25 cycles: both policies see it at the same steps
    for slot in tr.collector.slots.values():
        trunc = slot.buf.truncated.numpy()
        assert trunc[24].all() and trunc[49].all() and trunc.sum() == 2 * trunc.shape[1]


def test_continuous_actions_train_and_are_clipped_to_the_box(tmp_path):
    cfg = rl.preset("marl/simple_adversary_continuous")
    cfg = dataclasses.replace(cfg, total_steps=1600, out=str(tmp_path / "c"), tensorboard=False)
    cfg.rollout.num_steps = 50
    res = rl.train(cfg)
    assert res.status == "finished" and np.isfinite(res.metrics[-1]["agent/kl_rollout"])
    from klppo.nn.distributions import DiagGaussianHead
    from klppo.rl.marl.trainer import MultiTrainer

    tr = MultiTrainer.alone(dataclasses.replace(cfg, out=None), tmp_path)
    assert all(isinstance(u.agent.head, DiagGaussianHead) for u in tr.units.values())
    sent: list[dict[str, np.ndarray]] = []
    step = tr.env.step
    tr.env.step = lambda actions: (sent.append({p: a.copy() for p, a in actions.items()}),
                                   step(actions))[1]
    tr.start()
    tr.collector.collect(1)
    space = tr.spec.action_spaces["agent"]
    to_env = np.concatenate([s["agent"] for s in sent])
    in_buffer = tr.collector.slots["agent"].np["actions"].reshape(-1, *space.shape)
    assert ((to_env >= space.low) & (to_env <= space.high)).all()  # the env gets the box
    outside = (in_buffer < space.low) | (in_buffer > space.high)
    assert outside.any()  # the buffer keeps the sampled (unclipped) actions for the gradient
    assert np.array_equal(np.clip(in_buffer, space.low, space.high), to_env.reshape(
        in_buffer.shape))


def test_default_mapping_is_one_policy_per_agent(tmp_path):
    res = rl.train(short(tmp_path, policies=()))
    assert res.policies == ["adversary_0", "agent_0", "agent_1"]


# ------------------------------------------------------------------ bad input: one line, exit 2
BAD = {
    "policy_without_agents": (["--marl.policies", "adversary=adversary_*", "agent"],
                              "marl.policies='agent': expected key=value"),
    "policy_matches_nothing": (["--marl.policies", "adversary=adversary_*", "agent=good_*"],
                               "matches no agent"),
    "agent_in_two_policies": (["--marl.policies", "a=adversary_0,agent_0", "b=agent_*"],
                              "already in policy 'a'"),
    "agent_in_no_policy": (["--marl.policies", "adversary=adversary_*", "agent=agent_0"],
                           "['agent_1'] are in no policy"),
    "policy_named_twice": (["--marl.policies", "a=adversary_*", "a=agent_*"], "named twice"),
    "override_unknown_policy": (["--marl.overrides", "good:kl.target=0.1"], "good:kl.target"),
    "override_not_per_policy": (["--marl.overrides", "agent:total_steps=5"],
                                "not a per-policy field"),
    "override_bad_value": (["--marl.overrides", "agent:kl.target=-1"], "policy agent"),
    "override_unknown_field": (["--marl.overrides", "agent:ppo.lr_schedule=1"], "lr_schedule"),
    "override_wrong_type": (["--marl.overrides", "agent:ppo.lr=fast"], "ppo.lr='fast'"),
    "override_minibatch": (["--marl.overrides", "agent:ppo.minibatch-size=7"],
                           "minibatch"),
    "env_kwarg_unknown": (["--marl.env-kwargs", "max_cycles=25", "wings=2"], "wings"),
    "env_kwarg_malformed": (["--marl.env-kwargs", "max_cycles"], "marl.env_kwargs='max_cycles'"),
    "env_module_missing": (["--env", "pettingzoo:no_such_pkg_xyz.env_v0"], "no_such_pkg_xyz"),
    "env_module_not_parallel": (["--env", "pettingzoo:json"], "has no parallel_env()"),
    "async_vectorization": (["--rollout.vectorization", "async"], "rollout.vectorization"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_multiagent_input_is_one_line_and_makes_no_directory(tmp_path, capsys, name):
    flags, expect = BAD[name]
    out = tmp_path / "run"
    code = main(["train", *GOOD, *flags, "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("klppo train: "), err
    assert "Traceback" not in err and expect in err, err
    assert not out.exists()


def test_run_directory_is_the_single_agent_one(tmp_path):
    out = tmp_path / "run"
    assert main(["train", *GOOD, "--out", str(out)]) == 0
    assert {"config.yaml", "metrics.jsonl", "checkpoint.pt", "status.json",
            "metadata.json"} <= {p.name for p in out.iterdir()}
    assert json.loads((out / "status.json").read_text())["state"] == "finished"


# ------------------------------------------------------------------ using the trained policies
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("marl") / "run"
    assert main(["train", *GOOD, "--out", str(out)]) == 0
    return out


def test_load_names_a_policy_and_acts_like_the_training_network(tiny_run):
    import torch

    import klppo
    from klppo.rl.policy import load_policies

    pols = load_policies(tiny_run)
    assert sorted(pols) == ["adversary", "agent"]
    agent = klppo.load(tiny_run, policy="agent")
    obs = np.random.default_rng(0).normal(size=(4, 10)).astype(np.float32)
    state = torch.load(tiny_run / "checkpoint.pt", weights_only=False)
    net = pols["agent"].agent
    net.load_state_dict(state["policies"]["agent"]["agent"])
    expect = net.policy_params(torch.from_numpy(obs)).argmax(-1).numpy()
    assert (agent.act(obs) == expect).all()
    with pytest.raises(ValueError, match="must be one of"):
        klppo.load(tiny_run)


def test_eval_plays_each_policy_trained_or_random(tiny_run, capsys):
    from klppo.rl.marl.evaluate import evaluate_policies

    a = evaluate_policies(tiny_run, episodes=3, random=["agent"])
    b = evaluate_policies(tiny_run, episodes=3, random=["agent"])
    assert a["adversary"].actor == "trained" and a["agent"].actor == "random"
    assert a["agent"].returns == b["agent"].returns  # seeded
    assert main(["eval", str(tiny_run), "--episodes", "2", "--random", "adversary"]) == 0
    out = capsys.readouterr().out
    assert "adversary" in out and "random" in out
    saved = json.loads((tiny_run / "eval.json").read_text())
    assert saved["policies"]["adversary"]["actor"] == "random"
    assert main(["eval", str(tiny_run), "--random", "nobody"]) == 2
    assert "not policies of this run" in capsys.readouterr().err
