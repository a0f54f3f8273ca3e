"""The one engine, whose unit is a group of runs: each run in a group equals the same run alone
(a group of one) bit for bit (metrics and whole checkpoint), whatever runs share its process and
whatever features it uses (actuators, BAPO, multi-agent, a shared trunk on the torch stack);
clip == per_sample_kl inside it; exact resume after SIGKILL in any grouping; one run's failure
ends that run alone; runs that cannot share a group are refused in one line (issues #22, #29)."""

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from klppo import rl
from klppo.rl.config import ConfigError
from klppo.rl.engine.rundirs import train_batched, train_group
from klppo.rl.trainer import TIMING_KEYS
from tests.waiting import wait_for_lines

ROOT = Path(__file__).resolve().parents[2]


def strip(metrics, drop=()):
    return [{k: v for k, v in m.items() if k not in TIMING_KEYS and k not in drop}
            for m in metrics]


def same_state(a, b, path="state"):
    """Every entry of two checkpoints equal (tensors and arrays exactly); the differing path."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), path
        for k in a:
            same_state(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            same_state(x, y, f"{path}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b), path
    else:
        assert a == b, path


def checkpoint(run_dir):
    state = torch.load(Path(run_dir) / "checkpoint.pt", weights_only=False)
    state["config"].pop("out")
    return state


def config(out, preset="klip/cartpole", steps=2048, **over):
    c = rl.preset(preset)
    nested = {k: over.pop(k) for k in ("ppo", "kl", "rollout") if k in over}
    c = dataclasses.replace(c, out=str(out), total_steps=steps, tensorboard=False, **over)
    for k, v in nested.items():
        c = dataclasses.replace(c, **{k: dataclasses.replace(getattr(c, k), **v)})
    return c


#: runs of one shape that differ in everything the engine keeps per run
CARTPOLE = [
    dict(objective="clip", seed=0),
    dict(objective="per_sample_kl", seed=1, ppo=dict(shape="sigmoid", softness=0.1,
                                                      norm_adv="minibatch")),
    dict(objective="kl_penalty", seed=2, kl=dict(controller="step", preset="klip", target=0.02,
                                                 cadence="minibatch", measure="last_minibatch")),
    dict(objective="kl_penalty", seed=3, ppo=dict(kl_estimator="k3", ent_coef=0.01),
         kl=dict(controller="proportional", target=0.01, cadence="epoch", measure="epoch_mean")),
    dict(objective="clip", seed=4, ppo=dict(target_kl=0.002, early_stop="minibatch", lr=1e-3)),
    dict(objective="clip_kl", seed=5, ppo=dict(target_kl=0.002, early_stop="epoch",
                                               anneal_lr=False),
         kl=dict(controller="pid", target=0.01)),
]

def test_rows_that_step_on_every_minibatch_equal_their_runs_alone(tmp_path):
    """A stack whose rows have no minibatch check (no minibatch early stop, no actuator) steps
    them all on every minibatch; one of them stops after an epoch (CleanRL's rule) and steps
    no more while the others go on."""
    runs = [CARTPOLE[0], CARTPOLE[1], CARTPOLE[5], CARTPOLE[3]]
    batched = train_batched([config(tmp_path / f"b{i}", **v) for i, v in enumerate(runs)])
    ordinary = [rl.train(config(tmp_path / f"o{i}", **v)) for i, v in enumerate(runs)]
    assert_engines_agree(batched, ordinary)
    stopped = [m for m in batched[2].metrics if m["early_stop"] == 1.0]
    assert stopped and any(m["epochs"] < 10 for m in stopped)


@pytest.mark.parametrize("env", ["cartpole", "pendulum"])
def test_the_early_stop_probe_is_the_k3_of_the_steps_own_log_probs(tmp_path, monkeypatch, env):
    """SB3's ``approx_kl``, the minibatch early stop's k3, is the k3 of the log-probabilities
    the step then computes on the same minibatch (``NumpyStack.probe_k3``, one stacked forward
    for every probing row), in a group and alone; a categorical and a Gaussian head."""
    from klppo.core.kl import k3
    from klppo.rl.engine.numpy_stack import NumpyStack

    probe, step, seen = NumpyStack.probe_k3, NumpyStack.step, []
    last: dict[int, float] = {}

    def probing(self, rows, idx, mb):
        out = probe(self, rows, idx, mb)
        last.update(zip(rows.tolist(), out))
        return out

    def stepping(self, rows, mb, losses, betas, ws, log=None):
        results = step(self, rows, mb, losses, betas, ws, log)
        for a, (r, res) in enumerate(zip(rows.tolist(), results)):
            seen.append((last.pop(r), float(k3(np.asarray(res.logp) - mb.logp[a]).mean())))
        return results

    monkeypatch.setattr(NumpyStack, "probe_k3", probing)
    monkeypatch.setattr(NumpyStack, "step", stepping)
    ppo = dict(target_kl=1.0, early_stop="minibatch")  # checked before every step, never met
    make = (lambda i, **o: config(tmp_path / f"r{i}", **o)) if env == "cartpole" else \
        (lambda i, **o: pendulum(tmp_path / f"r{i}", **o))
    train_batched([make(i, seed=i, ppo=ppo) for i in range(3)])
    rl.train(make(3, seed=3, ppo=ppo))
    assert len(seen) > 50 and any(p > 0 for p, _ in seen)
    assert all(p == s for p, s in seen), [(p, s) for p, s in seen if p != s][:3]


PENDULUM = [  # a Gaussian policy, two envs per run, observation and reward normalisation
    dict(objective="clip", seed=0),
    dict(objective="kl_penalty", seed=7, ppo=dict(kl_estimator="k1", max_grad_norm=0.1),
         kl=dict(controller="exponential", target=0.01)),
]


def pendulum(out, **over):
    return config(out, env="Pendulum-v1", steps=2048,
                  rollout=dict(num_envs=2, num_steps=256, norm_obs=True, norm_reward=True), **over)


def assert_engines_agree(batched, ordinary):
    for b, o in zip(batched, ordinary):
        assert b.status == o.status == "finished"
        assert strip(b.metrics) == strip(o.metrics)
        same_state(checkpoint(b.run_dir), checkpoint(o.run_dir))
        meta = json.loads((b.run_dir / "metadata.json").read_text())
        assert meta["engine"] == {"name": "group", "runs": len(batched)}
        assert sorted(p.name for p in b.run_dir.iterdir()) == \
            sorted(p.name for p in o.run_dir.iterdir())


def test_each_run_equals_the_ordinary_engine_bit_for_bit(tmp_path):
    """Controllers at every cadence, both early stops (a run that stops steps no more while the
    others go on), minibatch advantage normalisation, an entropy bonus, sampled KL, other lrs."""
    batched = train_batched([config(tmp_path / f"b{i}", **v) for i, v in enumerate(CARTPOLE)])
    ordinary = [rl.train(config(tmp_path / f"o{i}", **v)) for i, v in enumerate(CARTPOLE)]
    assert_engines_agree(batched, ordinary)
    last = [r.metrics[-1] for r in batched]
    assert last[4]["early_stop"] == 1.0 and last[5]["early_stop"] == 1.0  # the stops happened
    assert last[2]["controller_updates"] > 1 and last[3]["beta"] != 1.0


def test_a_gaussian_normalised_run_equals_the_ordinary_engine(tmp_path):
    batched = train_batched([pendulum(tmp_path / f"b{i}", **v) for i, v in enumerate(PENDULUM)])
    ordinary = [rl.train(pendulum(tmp_path / f"o{i}", **v)) for i, v in enumerate(PENDULUM)]
    assert_engines_agree(batched, ordinary)


@pytest.mark.slow
def test_mujoco_runs_equal_the_ordinary_engine(tmp_path):
    pytest.importorskip("mujoco")
    runs = [dict(objective="clip", seed=0), dict(objective="per_sample_kl", seed=1),
            dict(objective="kl_penalty", seed=2, kl=dict(controller="step", target=0.02))]
    cfg = lambda out, v: config(out, "klip/hopper", 1536, rollout=dict(num_steps=512), **v)  # noqa: E731
    batched = train_batched([cfg(tmp_path / f"b{i}", v) for i, v in enumerate(runs)])
    ordinary = [rl.train(cfg(tmp_path / f"o{i}", v)) for i, v in enumerate(runs)]
    assert_engines_agree(batched, ordinary)


def test_a_runs_numbers_do_not_depend_on_its_group(tmp_path):
    """Same seed, same metrics: the run of seed 0 alone, beside seed 1, beside seed 2."""
    groups = [[0], [0, 1], [2, 0]]
    seen = []
    for g, seeds in enumerate(groups):
        res = train_batched([config(tmp_path / f"g{g}s{s}", seed=s, steps=1536) for s in seeds])
        seen.append(strip(res[seeds.index(0)].metrics))
    assert seen[0] == seen[1] == seen[2]
    other = train_batched([config(tmp_path / "s1", seed=1, steps=1536)])[0]
    assert strip(other.metrics) != seen[0]


def test_cartpoles_of_two_physics_side_by_side_equal_each_alone(tmp_path):
    """Rows 0 and 2 step as one CartPole array computation, row 1 (other physics) on its own:
    the stacked arrays are written at rows that are not side by side."""
    runs = [dict(seed=0), dict(seed=1, env_kwargs={"sutton_barto_reward": True}), dict(seed=2)]
    batched = train_batched([config(tmp_path / f"b{i}", steps=1536, **v)
                             for i, v in enumerate(runs)])
    ordinary = [rl.train(config(tmp_path / f"o{i}", steps=1536, **v))
                for i, v in enumerate(runs)]
    assert_engines_agree(batched, ordinary)


def test_clip_equals_per_sample_kl_inside_the_engine(tmp_path):
    a, b = train_batched([config(tmp_path / "clip", objective="clip", steps=3072),
                          config(tmp_path / "psk", objective="per_sample_kl", steps=3072)])
    drop = {"loss", "loss_objective"}  # the objectives' values differ; gradients do not
    assert strip(a.metrics, drop) == strip(b.metrics, drop)
    assert any(m["frac_kill"] > 0 for m in a.metrics)
    sa, sb = checkpoint(a.run_dir)["agent"], checkpoint(b.run_dir)["agent"]
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def full_runs(tmp_path, seeds):
    return train_batched([config(tmp_path / f"full{s}", seed=s, objective="kl_penalty",
                                 steps=4096, checkpoint_every=2) for s in seeds])


def test_sigkill_then_resume_is_exact_in_either_engine(tmp_path):
    """A batched group killed mid-run: two of its runs resume together (a new group), the third
    in the ordinary engine; each ends with the metrics and checkpoint of an uninterrupted run."""
    seeds = [0, 1, 2]
    full = full_runs(tmp_path, seeds)
    dirs = [tmp_path / f"killed{s}" for s in seeds]
    code = f"""
import dataclasses, klppo.rl as rl
from klppo.rl.engine.rundirs import train_batched
def c(out, s):
    x = rl.preset("klip/cartpole")
    return dataclasses.replace(x, out=out, seed=s, objective="kl_penalty", total_steps=4096,
                               tensorboard=False, checkpoint_every=2)
train_batched([c(d, s) for d, s in zip({[str(d) for d in dirs]!r}, {seeds!r})])
"""
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    wait_for_lines(dirs[0] / "metrics.jsonl", 3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert 3 <= len((dirs[0] / "metrics.jsonl").read_text().splitlines()) < 8
    res = train_group(dirs[:2])
    res.append(rl.resume(dirs[2]))
    for r, f in zip(res, full):
        assert r.status == "finished" and strip(r.metrics) == strip(f.metrics)
        same_state(checkpoint(r.run_dir), checkpoint(f.run_dir))


def test_an_ordinary_runs_checkpoint_resumes_in_the_batched_engine(tmp_path):
    (full,) = full_runs(tmp_path, [1])

    def crash(m):
        if m["iteration"] == 5:
            raise RuntimeError("crash")
    with pytest.raises(rl.TrainingError):
        rl.train(config(tmp_path / "ord", seed=1, objective="kl_penalty", steps=4096,
                        checkpoint_every=2), on_iteration=crash)
    (back,) = train_group([tmp_path / "ord"])
    assert back.status == "finished" and strip(back.metrics) == strip(full.metrics)
    same_state(checkpoint(back.run_dir), checkpoint(full.run_dir))
    assert json.loads((back.run_dir / "metadata.json").read_text())["resumes"][0]["engine"] == \
        {"name": "group", "runs": 1}


def test_one_runs_failure_ends_that_run_alone(tmp_path):
    env = "tests.rl.envs_for_tests:KlppoTest/NaNForSeed-v0"
    cfgs = [config(tmp_path / f"r{s}", env=env, seed=s, steps=1024,
                   rollout=dict(num_envs=1, num_steps=128, vectorization="sync"))
            for s in (0, 1, 2)]
    res = train_batched(cfgs)
    assert [r.status for r in res] == ["finished", "failed", "finished"]
    status = json.loads((tmp_path / "r1" / "status.json").read_text())
    assert status["state"] == "failed" and "non-finite observation" in status["error"]
    assert status["error"].startswith("iteration 3, step ")
    alone = rl.train(dataclasses.replace(cfgs[0], out=str(tmp_path / "alone")))
    assert strip(res[0].metrics) == strip(alone.metrics)


def test_runs_that_cannot_share_a_group_are_refused_in_one_line_before_any_directory(tmp_path):
    ok = config(tmp_path / "a")
    stacks = "they differ in stacks"
    cases = [
        (config(tmp_path / "b", net=dataclasses.replace(ok.net, shared_trunk=True)), stacks),
        (config(tmp_path / "b", fast_path=False), stacks),
        (config(tmp_path / "b", rollout=dict(num_envs=8)), stacks),
        (config(tmp_path / "b", env="Acrobot-v1"), stacks),
        (config(tmp_path / "b", rollout=dict(num_steps=64, num_envs=8)), "rollout.num_steps"),
    ]
    if not torch.cuda.is_available():  # a device that does not resolve here
        cases.append((config(tmp_path / "b", device="cuda"), "device='cuda'"))
    for other, words in cases:
        with pytest.raises(ConfigError, match=re.escape(words)) as e:
            train_batched([ok, other])
        assert "\n" not in str(e.value)
    assert not any(tmp_path.iterdir())


#: every per-run feature the engine once refused for grouping, in one group of one shape
FEATURES = [
    dict(objective="clip", seed=0, ppo=dict(anneal_lr=False), kl=dict(actuator="lr",
                                                                      target=0.005)),
    dict(objective="clip_kl", seed=1, kl=dict(actuator="clip", actuator_rule="rl_games")),
    dict(objective="clip", seed=2, ppo=dict(band_controller="bapo")),
    dict(objective="kl_penalty", seed=3, kl=dict(controller="step", preset="klip")),
]


def test_actuators_and_band_controllers_train_in_a_group_as_alone(tmp_path):
    grouped = train_batched([config(tmp_path / f"b{i}", **v) for i, v in enumerate(FEATURES)])
    alone = [rl.train(config(tmp_path / f"o{i}", **v)) for i, v in enumerate(FEATURES)]
    assert_engines_agree(grouped, alone)
    last = [r.metrics[-1] for r in grouped]
    assert last[0]["actuator_updates"] > 0 and last[1]["actuator_updates"] > 0
    assert "bapo_c_high" in last[2] and last[3]["controller_updates"] == 1


@pytest.mark.parametrize("net", [dict(shared_trunk=True), dict(shared_trunk=True,
                                                                separate_losses=True),
                                 dict(hidden=(32,))], ids=["trunk", "trunk-separate", "one"])
def test_torch_stack_networks_train_in_a_group_as_alone(tmp_path, net):
    """Torch rows (a shared trunk: any network klppo builds) are stacked too; a run's numbers
    do not depend on the rows beside it (a lone row is padded, see torch_stack)."""
    cfgs = lambda p: [config(tmp_path / f"{p}{s}", seed=s, steps=1536, fast_path=False,  # noqa: E731
                             net=dataclasses.replace(rl.preset("klip/cartpole").net, **net))
                      for s in (0, 1)]
    grouped = train_batched(cfgs("g"))
    alone = [rl.train(c) for c in cfgs("a")]
    for g, a in zip(grouped, alone):
        assert strip(g.metrics) == strip(a.metrics)


def test_multi_agent_runs_train_in_a_group_as_alone(tmp_path):
    """A multi-agent run's policies are rows (of two stacks here: their observations differ);
    two runs share the group and each equals itself alone."""
    pytest.importorskip("mpe2")  # the marl extra

    def c(out, seed):
        x = rl.preset("marl/simple_adversary")
        return dataclasses.replace(x, out=str(out), seed=seed, total_steps=1600,
                                   tensorboard=False)
    grouped = train_batched([c(tmp_path / f"g{s}", s) for s in (0, 1)])
    alone = [rl.train(c(tmp_path / f"a{s}", s)) for s in (0, 1)]
    assert_engines_agree(grouped, alone)
    assert "adversary/beta" in grouped[0].metrics[-1]


def test_wandb_runs_log_side_by_side_in_a_group(tmp_path, monkeypatch):
    """Each run of a group owns its W&B run (wandb's reinit='create_new')."""
    import types

    runs = []

    class FakeRun:
        def __init__(self, **kw):
            self.init, self.logged = kw, []

        def log(self, data, step):
            self.logged.append(step)

        def finish(self):
            pass

    def init(**kw):
        runs.append(FakeRun(**kw))
        return runs[-1]

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    res = train_batched([config(tmp_path / f"w{s}", seed=s, steps=1536, track="wandb")
                         for s in (0, 1)])
    assert [r.init["reinit"] for r in runs] == ["create_new", "create_new"]
    assert [r.logged for r in runs] == [[m["global_step"] for m in x.metrics] for x in res]
    assert [r.init["dir"] for r in runs] == [str(x.run_dir) for x in res]


def test_a_group_mixing_normalised_and_raw_runs_equals_each_alone(tmp_path):
    """Observation and reward normalisation per run: a group of a normalised run, a raw one and
    one normalising observations only gives each run's numbers alone (a group that normalised
    every run, or none, would not)."""
    rolls = [dict(num_envs=2, num_steps=256, norm_obs=True, norm_reward=True),
             dict(num_envs=2, num_steps=256, norm_obs=False, norm_reward=False),
             dict(num_envs=2, num_steps=256, norm_obs=True, norm_reward=False)]
    cfg = lambda out, i: config(out, env="Pendulum-v1", steps=1024, seed=i,  # noqa: E731
                                rollout=rolls[i])
    batched = train_batched([cfg(tmp_path / f"b{i}", i) for i in range(3)])
    ordinary = [rl.train(cfg(tmp_path / f"o{i}", i)) for i in range(3)]
    assert_engines_agree(batched, ordinary)
    assert "obs_norm" in checkpoint(batched[0].run_dir)
    assert checkpoint(batched[1].run_dir).get("obs_norm") is None


#: pairs of runs with one loss setting but their beta (one family of the numpy stack's step:
#: heads and closed forms as one [F, n] computation), minibatch advantage normalisation (per
#: row), and an early stop (a family stepping as a gathered subset while a stopped row waits)
FAMILIES = [
    dict(objective="kl_penalty", seed=0, kl=dict(controller="fixed", beta=0.3)),
    dict(objective="kl_penalty", seed=1, kl=dict(controller="proportional", target=0.01)),
    dict(objective="clip", seed=2, ppo=dict(target_kl=0.002, early_stop="minibatch",
                                            norm_adv="minibatch")),
    dict(objective="clip", seed=3, ppo=dict(norm_adv="minibatch", lr=1e-3)),
]


@pytest.mark.parametrize("env", ["cartpole", "pendulum"])
def test_runs_sharing_a_loss_step_as_one_family_each_as_alone(tmp_path, env):
    from klppo.rl.engine.rows import loss_families
    from klppo.rl.update import make_loss

    make = (lambda out, v: config(out, steps=1536, **v)) if env == "cartpole" else \
        (lambda out, v: pendulum(out, **v))
    batched = train_batched([make(tmp_path / f"b{i}", v) for i, v in enumerate(FAMILIES)])
    ordinary = [rl.train(make(tmp_path / f"o{i}", v)) for i, v in enumerate(FAMILIES)]
    assert_engines_agree(batched, ordinary)
    losses = [make_loss(make(tmp_path / "x", v)) for v in FAMILIES]
    assert loss_families(losses) == [[0, 1], [2, 3]]
    assert any(m["early_stop"] == 1.0 for m in batched[2].metrics)
    assert len({m["beta"] for r in batched[:2] for m in r.metrics}) > 1


def test_a_callback_stops_one_run_of_a_group_checkpointed_while_the_other_finishes(tmp_path):
    """The one run loop serves a run alone, a group and klppo rlhf alike: a tuner's StopRun
    from ``on_iteration`` ends that run as its state (checkpointed, resumable), in a group too."""
    from klppo.runs.lifecycle import StopRun

    asked = []

    def prune_first_at_2(m):
        if m["iteration"] == 2 and not asked:
            asked.append(m)
            raise StopRun("pruned", "below the median")

    res = train_batched([config(tmp_path / f"r{s}", seed=s, steps=2048) for s in (0, 1)],
                        on_iteration=prune_first_at_2)
    assert [r.status for r in res] == ["pruned", "finished"]
    status = json.loads((res[0].run_dir / "status.json").read_text())
    assert status["reason"] == "below the median" and status["checkpoint_iteration"] == 2
    assert checkpoint(res[0].run_dir)["iteration"] == 2
    assert len(res[1].metrics) == res[1].metrics[-1]["iteration"] > 2
