"""The lr and clip actuators in real training runs: the learning rate (or eps) every optimiser
step used equals rsl_rl's or rl_games' rule, transcribed in tests/core/test_actuators.py and fed
the KLs the run measured; the logged ``lr`` / ``clip_eps`` is the rule's value at the end of each
iteration; the checkpoint holds the rule's value (rsl_rl #221 loses it)."""

import dataclasses

import numpy as np
import pytest
import torch

from klppo import rl
from klppo.nn.numpy.adam import NumpyAdam
from klppo.rl.engine.numpy_stack import NumpyStack
from klppo.rl.engine.rows import RowSlot
from klppo.rl.engine.torch_stack import TorchStack
from klppo.rl.optim import TorchAdam
from klppo.rl.trainer import _Trainer
from klppo.runs import checkpoint as ckpt
from tests.core.test_actuators import rl_games_lrs, rsl_rl_lrs

ITERS, STEPS_PER_ITER = 3, 80  # klip/cartpole: 512 samples, minibatch 64, 10 epochs


def config(tmp_path, fast_path=True, objective="clip", **kl):
    cfg = rl.preset("klip/cartpole")
    cfg = dataclasses.replace(cfg, objective=objective, total_steps=ITERS * cfg.batch_size,
                              tensorboard=False, out=str(tmp_path / "run"), fast_path=fast_path)
    if kl.get("actuator") == "lr":
        cfg.ppo = dataclasses.replace(cfg.ppo, anneal_lr=False)
    cfg.kl = dataclasses.replace(cfg.kl, **kl)
    return rl.validate(cfg)


class Recorder:
    """What the run (a stack of one row) measured and used, taken where the stacks compute and
    apply it."""

    def __init__(self, monkeypatch):
        self.before, self.after, self.lr, self.eps = [], [], [], []
        measure = RowSlot.analytic_kl

        def analytic_kl(backend, idx):
            self.before.append(measure(backend, idx))
            return self.before[-1]

        monkeypatch.setattr(RowSlot, "analytic_kl", analytic_kl)
        for cls in (NumpyStack, TorchStack):
            monkeypatch.setattr(cls, "step", self._step(cls.step))
        for cls in (NumpyAdam, TorchAdam):
            monkeypatch.setattr(cls, "step", self._adam(cls.step))

    def _step(self, step):
        def wrapped(stack, rows, mb, losses, betas, ws=None, log=None):
            assert len(rows) == 1
            self.eps.append(losses[0].band.eps)
            r = step(stack, rows, mb, losses, betas, ws, log)
            # the minibatch mean, rounded to float32 as rl_games' torch mean is
            kl = r[0].kl.mean() if isinstance(r[0].kl, torch.Tensor) else np.mean(r[0].kl)
            self.after.append(float(kl))
            return r
        return wrapped

    def _adam(self, step):
        def wrapped(opt, *args):
            self.lr.append(float(opt.lr[0]))
            return step(opt, *args)
        return wrapped


def logged(res, key):
    return [m[key] for m in res.metrics]


def ends(values):
    return [values[STEPS_PER_ITER * (i + 1) - 1] for i in range(ITERS)]


@pytest.mark.parametrize("fast_path", [True, False])
def test_lr_follows_rsl_rl_rule_exactly(tmp_path, monkeypatch, fast_path):
    """rsl_rl: the KL of each minibatch before its step sets the lr that step uses."""
    rec = Recorder(monkeypatch)
    cfg = config(tmp_path, fast_path, actuator="lr")
    res = rl.train(cfg)
    assert len(rec.before) == len(rec.lr) == ITERS * STEPS_PER_ITER
    expect = rsl_rl_lrs(rec.before, cfg.ppo.lr)
    assert rec.lr == expect
    assert len(set(expect)) > 10, "the rule must have moved the lr to test anything"
    assert logged(res, "lr") == ends(expect)
    assert logged(res, "actuator_kl") == ends(rec.before)
    assert set(logged(res, "actuator_target")) == {0.01}


def test_lr_follows_rl_games_rule_exactly(tmp_path, monkeypatch):
    """rl_games (legacy schedule): a step's own KL sets the lr from the next step on."""
    rec = Recorder(monkeypatch)
    cfg = config(tmp_path, actuator="lr", actuator_rule="rl_games", target=0.01)
    res = rl.train(cfg)
    values = rl_games_lrs(rec.after, cfg.ppo.lr, kl_threshold=0.01)
    assert rec.lr == [cfg.ppo.lr, *values[:-1]]
    assert len(set(values)) > 10
    assert logged(res, "lr") == ends(values)
    assert rec.before == []  # this timing needs no extra forward pass


def test_clip_radius_follows_the_rule_and_the_lr_keeps_its_schedule(tmp_path, monkeypatch):
    rec = Recorder(monkeypatch)
    cfg = config(tmp_path, objective="per_sample_kl", actuator="clip", target=0.004)
    res = rl.train(cfg)
    expect = rsl_rl_lrs(rec.before, cfg.ppo.eps, desired_kl=0.004, lo=0.02, hi=0.5)
    assert rec.eps == expect and len(set(expect)) > 5
    assert logged(res, "clip_eps") == ends(expect)
    assert logged(res, "lr") == [cfg.ppo.lr * (1 - i / ITERS) for i in range(ITERS)]
    assert set(rec.lr[:STEPS_PER_ITER]) == {cfg.ppo.lr}


def test_checkpoint_holds_the_actuated_lr(tmp_path):
    """The state a resume restores is the rule's current lr, not ppo.lr (rsl_rl #221)."""
    cfg = config(tmp_path, actuator="lr")
    res = rl.train(cfg)
    state = ckpt.load_checkpoint(res.run_dir)
    assert state["actuator"]["name"] == "rsl_rl"
    assert state["actuator"]["value"] == res.metrics[-1]["lr"] == state["optimizer"]["lr"]
    assert state["actuator"]["value"] != cfg.ppo.lr
    assert state["actuator"]["num_updates"] == ITERS * STEPS_PER_ITER


@pytest.mark.parametrize("actuator", ["lr", "clip"])
def test_a_restored_run_acts_with_the_checkpointed_value(tmp_path, actuator):
    """A trainer built from the config and loaded from the checkpoint has the rule's value in
    the optimiser (lr) or the loss's band (clip), not the configured start."""
    cfg = config(tmp_path, actuator=actuator, actuator_rule="rl_games", target=0.001)
    res = rl.train(cfg)
    state = ckpt.load_checkpoint(res.run_dir)
    tr = _Trainer.alone(dataclasses.replace(cfg, out=str(tmp_path / "again")),
                        tmp_path / "again")
    tr.load_state_dict(state)
    tr.env.close()
    value = state["actuator"]["value"]
    if actuator == "lr":
        acting, start = tr.learner.backend.state_dict()["lr"], cfg.ppo.lr
        assert tr.unit.start_iteration(ITERS + 1) == value
    else:
        acting, start = tr.learner.loss.band.eps, cfg.ppo.eps
    assert acting == value == res.metrics[-1]["clip_eps" if actuator == "clip" else "lr"]
    assert value != start


def test_default_actuator_logs_the_constant_radius_and_checkpoints_nothing(tmp_path):
    res = rl.train(config(tmp_path))
    assert set(logged(res, "clip_eps")) == {0.2}
    assert "actuator_kl" not in res.metrics[0]
    assert ckpt.load_checkpoint(res.run_dir)["actuator"] is None


def test_a_checkpoint_written_before_the_actuator_fields_resumes(tmp_path):
    """A checkpoint whose stored config predates the kl.actuator* fields resumes when
    config.yaml has them at their defaults (what that run did), and is refused when not."""
    from klppo.rl.lifecycle import ResumeError
    from klppo.runs.rundir import read_yaml, write_yaml

    cfg = config(tmp_path)
    run = rl.train(cfg).run_dir
    state = ckpt.load_checkpoint(run)
    for key in ("actuator", "actuator_rule", "actuator_min", "actuator_max"):
        del state["config"]["kl"][key]
    ckpt.save_checkpoint(run, state)
    assert rl.resume(run).status == "finished"
    yaml = read_yaml(run / "config.yaml")
    yaml["kl"]["actuator"] = "clip"
    write_yaml(run / "config.yaml", yaml)
    with pytest.raises(ResumeError, match="kl.actuator='clip' but the checkpoint was made with"):
        rl.resume(run)
