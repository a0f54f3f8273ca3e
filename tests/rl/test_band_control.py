"""BAPO's adaptive clip bounds in real training runs: the band every optimiser step used equals
Algorithm 1 of arXiv:2510.18927, transcribed in tests/core/test_bound_controllers.py, replayed on
the ratios and advantages the run's minibatches had; the logged bounds are the last step's; the
checkpoint holds the rule's record; bad combinations are one line."""

import dataclasses

import numpy as np
import pytest
import torch

from klppo import rl
from klppo.core.bound_controllers import BalanceStats, BAPOController
from klppo.replay.lab import replay_bounds
from klppo.rl.config import ConfigError
from klppo.rl.engine.numpy_stack import NumpyStack
from klppo.rl.engine.rows import RowSlot
from klppo.rl.engine.torch_stack import TorchStack
from klppo.rl.trainer import _Trainer
from klppo.runs import checkpoint as ckpt
from tests.core.test_bound_controllers import paper_bapo

ITERS, STEPS_PER_ITER = 3, 80  # klip/cartpole: 512 samples, minibatch 64, 10 epochs
#: a target above the start share of many minibatches and an upper range starting near 1 with a
#: larger lr, so that some searches stop part way (with the paper's (1.2, 3.0) few CartPole
#: samples have w > c_high, and the bounds land at the start or at (b-, b+))
SETTING = ("0.5", ("0.6", "0.9"), ("1.01", "1.3"), "0.01", "0.02")
BAPO = {"bapo_target": 0.5, "bapo_high": (1.01, 1.3), "bapo_step_high": 0.01, "lr": 3e-3}


def config(tmp_path, fast_path=True, objective="clip", **ppo):
    cfg = rl.preset("klip/cartpole")
    cfg = dataclasses.replace(cfg, objective=objective, total_steps=ITERS * cfg.batch_size,
                              tensorboard=False, out=str(tmp_path / "run"), fast_path=fast_path)
    cfg.ppo = dataclasses.replace(cfg.ppo, band_controller="bapo", **{**BAPO, **ppo})
    return rl.validate(cfg)


class Recorder:
    """The ratio each step's band was chosen from, and the band and advantages the step used."""

    def __init__(self, monkeypatch):
        self.ratio, self.adv, self.edges, self.step_ratio = [], [], [], []
        measure = RowSlot.ratio

        def ratio(backend, idx):
            self.ratio.append(measure(backend, idx).numpy().copy())
            return torch.as_tensor(self.ratio[-1])

        monkeypatch.setattr(RowSlot, "ratio", ratio)
        for cls in (NumpyStack, TorchStack):
            monkeypatch.setattr(cls, "step", self._step(cls.step))

    def _step(self, step):
        def wrapped(stack, rows, mb, losses, betas, ws=None, log=None):
            assert len(rows) == 1  # a run alone: a stack of one
            band = losses[0].band
            self.edges.append((band.eps_low, band.eps_high))
            r = step(stack, rows, mb, losses, betas, ws, log)[0]
            self.adv.append(np.asarray(r.adv, dtype=np.float32).copy())
            self.step_ratio.append(np.asarray(r.samples["ratio"]).copy())
            return [r]
        return wrapped


def logged(res, key):
    return [m[key] for m in res.metrics]


def ends(values):
    return [values[STEPS_PER_ITER * (i + 1) - 1] for i in range(ITERS)]


@pytest.mark.parametrize("fast_path", [True, False])
def test_every_step_uses_the_papers_bounds_for_its_minibatch(tmp_path, monkeypatch, fast_path):
    rec = Recorder(monkeypatch)
    res = rl.train(config(tmp_path, fast_path))
    assert len(rec.ratio) == len(rec.edges) == len(rec.adv) == ITERS * STEPS_PER_ITER
    expect = [paper_bapo([float(x) for x in w], [float(x) for x in a], *SETTING)
              for w, a in zip(rec.ratio, rec.adv)]
    assert rec.edges == [(1.0 - lo, hi - 1.0) for lo, hi in expect]
    assert len(set(expect)) >= 4, "the rule must have moved the bounds to test anything"
    # the ratio the rule read is the step's own (at the parameters about to be stepped); the
    # numpy fast path computes the step's in numpy, the rule's in torch
    for w, ws in zip(rec.ratio, rec.step_ratio):
        if fast_path:
            np.testing.assert_allclose(w, ws, rtol=1e-5)
        else:
            assert np.array_equal(w, ws)
    assert logged(res, "bapo_c_low") == [b[0] for b in ends(expect)]
    assert logged(res, "bapo_c_high") == [b[1] for b in ends(expect)]
    assert logged(res, "bapo_updates") == [float(STEPS_PER_ITER)] * ITERS
    first = expect[:STEPS_PER_ITER]
    assert res.metrics[0]["bapo_c_high_mean"] == pytest.approx(np.mean([b[1] for b in first]))
    assert "clip_eps" not in res.metrics[0]  # the band is the bounds, logged as such
    # the lab replays the rule on the same statistics
    lab = replay_bounds(list(zip(rec.ratio, rec.adv)),
                        BAPOController(0.5, (0.6, 0.9), (1.01, 1.3), 0.01, 0.02))
    assert lab == expect


def test_per_sample_kl_with_the_clip_shape_takes_the_same_bounds(tmp_path, monkeypatch):
    """clip and per_sample_kl (clip shape) have one gradient: the same run, the same bounds."""
    rec = Recorder(monkeypatch)
    a = rl.train(config(tmp_path / "a"))
    b = rl.train(config(tmp_path / "b", objective="per_sample_kl"))
    n = ITERS * STEPS_PER_ITER
    assert rec.edges[:n] == rec.edges[n:]
    assert logged(a, "episode_return_mean") == logged(b, "episode_return_mean")


def test_checkpoint_holds_the_rule_and_a_restored_run_acts_with_it(tmp_path):
    cfg = config(tmp_path)
    res = rl.train(cfg)
    state = ckpt.load_checkpoint(res.run_dir)
    s = state["band_controller"]
    assert s["name"] == "bapo" and s["num_updates"] == ITERS * STEPS_PER_ITER
    last = res.metrics[-1]
    assert (s["info"]["c_low"], s["info"]["c_high"]) == (last["bapo_c_low"], last["bapo_c_high"])
    tr = _Trainer.alone(dataclasses.replace(cfg, out=str(tmp_path / "again")),
                        tmp_path / "again")
    tr.load_state_dict(state)
    tr.env.close()
    band = tr.learner.loss.band
    assert (band.eps_low, band.eps_high) == (1 - last["bapo_c_low"], last["bapo_c_high"] - 1)
    assert tr.learner.band.rule.info.as_dict() == s["info"]
    plain = dataclasses.replace(cfg.ppo, band_controller="none", bapo_target=0.4,
                                bapo_high=(1.2, 3.0), bapo_step_high=0.05)
    run = rl.train(dataclasses.replace(cfg, out=str(tmp_path / "plain"), ppo=plain)).run_dir
    assert ckpt.load_checkpoint(run)["band_controller"] is None


def test_statistics_come_from_the_minibatch_normalised_advantage(tmp_path, monkeypatch):
    """With ppo.norm_adv minibatch the rule reads the advantage the objective sees."""
    seen = []
    update = BAPOController.update

    def spy(self, stats):
        seen.append(stats)
        return update(self, stats)

    monkeypatch.setattr(BAPOController, "update", spy)
    rl.train(config(tmp_path, norm_adv="minibatch"))
    for s in seen[:20]:
        a = np.concatenate([s.pos_adv, -s.neg_adv])
        assert abs(a.mean()) < 1e-5 and a.std(ddof=1) == pytest.approx(1, abs=1e-4)


@pytest.mark.parametrize("changes, message", [
    ({"objective": "kl_penalty"}, "objective='kl_penalty': ppo.band_controller=bapo balances"),
    ({"objective": "per_sample_kl", "shape": "sigmoid", "softness": 0.1},
     "objective='per_sample_kl'"),
    ({"eps_high": 0.28}, "ppo.eps_high=0.28: ppo.band_controller=bapo sets both band edges"),
    ({"dual_clip": 3.0}, "ppo.dual_clip=3.0"),
    ({"eps": 0.3}, "ppo.eps=0.3: ppo.band_controller=bapo sets both band edges"),
    ({"actuator": "clip"}, "kl.actuator='clip': ppo.band_controller=bapo already moves"),
    ({"bapo_low": (0.9, 0.6)}, "ppo.bapo_low=(0.9, 0.6): the start must not exceed the max"),
    ({"bapo_high": (1.2, 3.0, 4.0)}, "ppo.bapo_high=(1.2, 3.0, 4.0): must be a list of 2"),
    ({"bapo_target": 0.0}, "ppo.bapo_target=0.0: must be in (0, 1]"),
    ({"bapo_step_low": 0.5}, "ppo.bapo_low=(0.6, 0.9): b- - a- must allow one step"),
    ({"band_controller": "none", "bapo_target": 0.5},
     "ppo.bapo_target=0.5: only ppo.band_controller bapo reads it"),
])
def test_combinations_it_cannot_serve_are_one_line(changes, message):
    cfg = rl.preset("klip/cartpole")
    ppo = {"band_controller": "bapo", **{k: v for k, v in changes.items()
                                          if k not in ("objective", "actuator")}}
    cfg.ppo = dataclasses.replace(cfg.ppo, **ppo)
    if "objective" in changes:
        cfg.objective = changes["objective"]
    if "actuator" in changes:
        cfg.kl = dataclasses.replace(cfg.kl, actuator=changes["actuator"])
    with pytest.raises(ConfigError) as e:
        rl.validate(cfg)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_lr_actuator_goes_with_it(tmp_path):
    """BAPO moves the band, the rsl_rl rule the lr: both act every minibatch."""
    cfg = config(tmp_path)
    cfg.ppo.anneal_lr = False
    cfg.kl = dataclasses.replace(cfg.kl, actuator="lr")
    res = rl.train(rl.validate(cfg))
    assert len(set(logged(res, "lr"))) > 1 and "bapo_c_low" in res.metrics[0]


def test_stats_are_the_rules_input():
    """BalanceStats splits by the advantage's sign (the pair form the lab takes is the same)."""
    s = BalanceStats.from_samples(np.array([0.5, 2.0, 1.0]), np.array([1.0, -2.0, 0.0]))
    assert s.pos_ratio.tolist() == [0.5] and s.neg_adv.tolist() == [2.0]
