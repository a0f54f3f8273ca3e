"""The KL early stops, counted: a scripted step backend makes the update loop meet a chosen KL
at a chosen minibatch, and the loop must check before every step (SB3's rule), leave both loops
at once, and report the epochs and steps it ran and the fraction of the planned ones.

SB3-contrib #313 / SB3 #1229 counted every planned epoch after an early stop; CleanRL #520 checks
once per epoch only (klppo's ``epoch`` rule, kept as CleanRL's)."""

import math

import numpy as np
import pytest
import torch

from klppo.core.controllers import make_controller
from klppo.nn.step import StepResult
from klppo.rl.config import PPOConfig, RolloutConfig, TrainConfig
from klppo.rl.config_checks import validate
from klppo.rl.update import Batch, Learner, make_loss
from tests.rl.update_helpers import update_one

B, MB, EPOCHS, TARGET = 8, 2, 5, 0.01
PER_EPOCH = B // MB


class Scripted:
    """A one-row stack (and its row) whose k3 check and whose steps' log-ratios follow a
    script."""

    fast, R, row = False, 1, 0

    @property
    def stack(self):
        return self

    def __init__(self, k3s=(), log_ratios=()):
        self.k3s, self.log_ratios = list(k3s), list(log_ratios)
        self.events = []

    def begin(self, batch, adv):
        self.batch, self.adv = batch, adv

    def probe_k3(self, rows, idx, mb):  # the stack's probe of its one row
        return [self.k3(idx[0])]

    def k3(self, idx):
        n = self.events.count("check")
        self.events.append("check")
        return self.k3s[n] if n < len(self.k3s) else 0.0

    def step(self, rows, mb, losses, betas, ws):
        idx = torch.from_numpy(mb.idx[0])
        n = self.events.count("step")
        self.events.append("step")
        x = self.log_ratios[n] if n < len(self.log_ratios) else 0.0
        zeros = torch.zeros(len(idx))
        loss = {k: torch.tensor(0.0) for k in ("loss", "loss_objective", "loss_critic",
                                                "loss_entropy")}
        samples = {"ratio": torch.full((len(idx),), float(np.exp(x))), "advantage": self.adv[idx],
                   "value_loss": zeros, "value_clipped": zeros.bool()}
        return [StepResult(idx, self.batch.logp[idx] + x, zeros, zeros, zeros, self.adv[idx],
                           torch.tensor(0.0), loss, samples)]

    def policy_kl(self, rows, obs, params, ws):
        return [0.0]

    def set_lr(self, lr):
        pass


def update(rule, backend):
    cfg = TrainConfig(rollout=RolloutConfig(num_envs=2, num_steps=4),
                      ppo=PPOConfig(minibatch_size=MB, update_epochs=EPOCHS, target_kl=TARGET,
                                    early_stop=rule))
    cfg = validate(cfg)
    g = torch.Generator().manual_seed(0)
    batch = Batch(torch.randn(B, 4, generator=g), torch.zeros(B, dtype=torch.long),
                  torch.full((B,), -0.7), torch.zeros(B, 2), torch.zeros(B),
                  torch.randn(B, generator=g), torch.zeros(B))
    lrn = Learner(cfg, backend, make_loss(cfg), make_controller("fixed"), g)
    return update_one(lrn, batch)[0].metrics


HIGH = 1.5 * TARGET * 1.01  # just above SB3's threshold


@pytest.mark.parametrize("fail_at, steps, epochs", [
    (None, EPOCHS * PER_EPOCH, EPOCHS),   # never stops
    (0, 0, 0),                            # the very first check
    (5, 5, 2),                            # inside the second epoch
    (8, 8, 2),                            # the first minibatch of the third epoch: 2 epochs ran
    (19, 19, 5),                          # the last minibatch
])
def test_minibatch_rule_checks_every_step_and_counts_what_ran(fail_at, steps, epochs):
    k3s = [0.0] * 20 if fail_at is None else [1.5 * TARGET] * fail_at + [HIGH]  # 1.5 t: not >
    backend = Scripted(k3s)
    m = update("minibatch", backend)
    expect = ["check", "step"] * steps + ([] if fail_at is None else ["check"])
    assert backend.events == expect  # a check before every step; nothing after the stop
    assert m["minibatch_steps"] == steps
    assert m["epochs"] == epochs
    assert m["update_fraction"] == steps / (EPOCHS * PER_EPOCH)
    assert m["early_stop"] == float(fail_at is not None)


def k3_of(x):
    return math.exp(x) - 1 - x


@pytest.mark.parametrize("big_at, steps", [
    (None, EPOCHS * PER_EPOCH),
    (PER_EPOCH - 1, PER_EPOCH),           # the first epoch's last step: stop after it
    (2 * PER_EPOCH - 2, EPOCHS * PER_EPOCH),  # not an epoch's last step: CleanRL reads only that
    (3 * PER_EPOCH - 1, 3 * PER_EPOCH),
])
def test_epoch_rule_reads_each_epochs_last_step(big_at, steps):
    x = 0.5
    assert k3_of(x) > TARGET
    ratios = [0.0] * 20
    if big_at is not None:
        ratios[big_at] = x
    backend = Scripted(log_ratios=ratios)
    m = update("epoch", backend)
    assert backend.events == ["step"] * steps  # the epoch rule takes no per-step check
    assert m["minibatch_steps"] == steps and m["epochs"] == steps // PER_EPOCH
    assert m["update_fraction"] == steps / (EPOCHS * PER_EPOCH)
    assert m["early_stop"] == float(steps < EPOCHS * PER_EPOCH)


def test_no_check_without_the_minibatch_rule():
    """The k3 check runs under the minibatch rule only (it costs a forward pass)."""
    backend = Scripted([HIGH] * 20)
    m = update("epoch", backend)
    assert "check" not in backend.events and m["minibatch_steps"] == EPOCHS * PER_EPOCH
