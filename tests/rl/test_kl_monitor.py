"""The KL monitor (klppo.core.monitor) in the trainer: warnings and metric flags when the
controller's KL stays above 2x or below 0.5x its target, or goes negative."""

import dataclasses

import pytest

from klppo import rl
from klppo.core.monitor import KLMonitor


def run(tmp_path, beta, target, **kl):
    cfg = rl.preset("klip/cartpole")
    cfg = dataclasses.replace(cfg, objective="kl_penalty", total_steps=3072, tensorboard=False,
                              out=str(tmp_path / "r"))
    cfg.kl = dataclasses.replace(cfg.kl, controller="fixed", beta=beta, target=target, **kl)
    return rl.train(cfg).metrics


def test_kl_far_above_target_raises_the_high_flag_after_patience(tmp_path, caplog):
    m = run(tmp_path, beta=1e-4, target=1e-7)
    assert [r["kl_alarm_high"] for r in m] == [0, 0, 1, 1, 1, 1]
    assert all(r["kl_alarm_low"] == 0 for r in m)
    assert "has stayed above 2x its target 1e-07 for 3 updates" in caplog.text


def test_kl_far_below_target_raises_the_low_flag(tmp_path, caplog):
    m = run(tmp_path, beta=100.0, target=10.0, monitor_patience=2)
    assert [r["kl_alarm_low"] for r in m] == [0, 1, 1, 1, 1, 1]
    assert "stayed below 0.5x its target 10" in caplog.text


def test_monitor_rules_and_negative_estimates():
    mon = KLMonitor(0.02, patience=2, unit="nats per token")
    assert [mon.update(k).high for k in (0.05, 0.05, 0.01, 0.05)] == [False, True, False, False]
    alarm = mon.update(-0.01)
    assert alarm.negative and "negative" in alarm.message and "nats per token" in alarm.message
    mon.load_state_dict({"above": 1, "below": 0})
    assert mon.update(0.1).high  # the streak continues from the checkpointed state
    with pytest.raises(ValueError):
        KLMonitor(0.02, high=0.5)


def test_warmup_holds_back_too_low_until_the_kl_reached_the_band_or_the_warmup_ended():
    """The rule: "too low" counts from update warmup + 1, or from the update where the KL first
    reached low * target; "too high" is never held back."""
    ramp = KLMonitor(6.0, patience=2, warmup=3)  # low band: 3.0
    assert [ramp.update(k).low for k in (0.1, 0.5, 1.0, 1.5, 2.0, 2.5)] == \
        [False, False, False, False, True, True]  # counted from update 4: below twice at 5
    reached = KLMonitor(6.0, patience=2, warmup=100)
    assert [reached.update(k).low for k in (0.1, 4.0, 1.0, 1.0)] == [False, False, False, True]
    high = KLMonitor(6.0, patience=2, warmup=100)
    assert [high.update(k).high for k in (20.0, 20.0)] == [False, True]
    state = ramp.state_dict()
    again = KLMonitor(6.0, patience=2, warmup=3)
    again.load_state_dict(state)
    assert again.update(1.0).low  # the counters survive a checkpoint
    old = KLMonitor(6.0, patience=1, warmup=3)
    old.load_state_dict({"above": 0, "below": 0})  # a checkpoint from before the warm-up
    assert old.update(1.0).low
    with pytest.raises(ValueError):
        KLMonitor(0.02, warmup=-1)


def test_clip_runs_have_no_kl_flags(tmp_path):
    cfg = dataclasses.replace(rl.preset("klip/cartpole"), total_steps=1024, tensorboard=False,
                              out=str(tmp_path / "c"))
    assert "kl_alarm_high" not in rl.train(cfg).metrics[0]
