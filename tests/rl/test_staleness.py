"""Stale rollouts in ``klppo train`` (``ppo.staleness`` k): the policy k updates back collects,
the current critic scores, the update's ratio is taken against the proximal policy (the current
one before the update) and ``ppo.mismatch_correction`` weights each sample by
``pi_prox / pi_behaviour`` (decoupled PPO's TIS, IcePop, MIS, M2PO: klppo.core.mismatch)."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from klppo import rl
from klppo.core.mismatch import mismatch_weights
from klppo.rl.config import ConfigError
from klppo.rl.engine.rundirs import train_batched
from klppo.rl.trainer import _Trainer
from klppo.runs.checkpoint import load_checkpoint, save_checkpoint
from tests.rl.test_engine import assert_engines_agree, config, strip
from tests.rl.update_helpers import rollout_batch


def stale(out, k=2, correction="tis", **over):
    ppo = {"staleness": k, "mismatch_correction": correction, **over.pop("ppo", {})}
    return config(out, ppo=ppo, **over)


def _logp_under(slot, snapshot, obs, actions):
    """log pi(actions | obs) of the policy ``snapshot`` (the row's own put back after)."""
    now = slot.policy_weights()
    slot.load_policy_weights(snapshot)
    try:
        return slot.log_prob(obs, actions)[1]
    finally:
        slot.load_policy_weights(now)


@pytest.mark.parametrize("fast_path", [True, False], ids=["numpy", "torch"])
def test_the_policy_k_updates_back_collects_and_the_proximal_policy_is_the_update_s_old(
        tmp_path, fast_path):
    """k = 2: after 3 updates, the 4th rollout is collected by the policy after update 1 (its
    log-probabilities), scored by the current critic (its values); the current policy is back
    in the row after the rollout. The update's batch holds the current policy's log-probs and
    weights min(rho, 2), rho = pi_prox / pi_behaviour, computed apart here."""
    cfg = stale(tmp_path / "run", steps=4096, fast_path=fast_path)
    tr = _Trainer.alone(cfg, tmp_path / "run")
    tr.start()
    slot = tr.unit.learner.backend
    snaps = [slot.policy_weights()]
    for _ in range(3):
        res = tr.group.iterate([0])[0]
        assert not isinstance(res, BaseException), res
        snaps.append(slot.policy_weights())
    assert len(tr.unit.past) == 3 and np.array_equal(tr.unit.past[0], snaps[1])
    tr.collect_rollout(4)  # iteration 4's rollout, as Group.iterate collects it
    assert np.array_equal(slot.policy_weights(), snaps[3])
    buf = tr.collector.buf
    obs, actions = buf.obs.numpy().reshape(cfg.batch_size, -1), buf.actions.numpy().reshape(
        cfg.batch_size, *buf.actions.shape[2:])
    behaviour = buf.logp.numpy().reshape(-1)
    np.testing.assert_allclose(behaviour, _logp_under(slot, snaps[1], obs, actions), atol=2e-5)
    assert np.abs(behaviour - _logp_under(slot, snaps[3], obs, actions)).max() > 1e-3
    with torch.no_grad():
        critic = tr.agent.value(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(buf.values.numpy().reshape(-1), critic, atol=2e-5)

    batch = tr.unit.proximal(rollout_batch(tr.unit, buf))
    prox = _logp_under(slot, snaps[3], obs, actions)
    np.testing.assert_array_equal(batch.logp.numpy(), prox)
    # the distribution parameters too (the analytic KL is taken against them): the current
    # policy's, not the behaviour's the buffer holds
    np.testing.assert_array_equal(batch.params.numpy(), slot.log_prob(obs, actions)[0])
    assert np.abs(batch.params.numpy() - buf.params.numpy().reshape(batch.params.shape)).max() \
        > 1e-3
    rho = np.exp(prox.astype(np.float64) - behaviour)
    np.testing.assert_allclose(batch.weight.numpy(), np.minimum(rho, 2.0), rtol=1e-5)
    assert tr.unit.mismatch["mismatch_kl_k3"] == pytest.approx(
        float(np.mean(rho - 1 - np.log(rho))), rel=1e-4)
    tr.close()


def test_the_first_rollouts_are_the_initial_policy_s_and_fresh_ones_weigh_1(tmp_path):
    """Iteration 1 is collected by the policy it updates (no mismatch: every weight 1);
    from iteration 2 the rollout is older than the proximal policy."""
    res = rl.train(stale(tmp_path / "run", steps=3072))
    kl = [m["mismatch_kl_k3"] for m in res.metrics]
    # (the rollout's log-probs come from the sampler's noise, the update's from the actions:
    # equal up to float32 rounding)
    assert kl[0] < 1e-12 and res.metrics[0]["mismatch_weight_mean"] == pytest.approx(1, abs=1e-6)
    assert all(x > 1e-6 for x in kl[1:])


@pytest.mark.parametrize("correction", ["tis", "mis", "icepop", "m2po"])
def test_each_correction_weighs_the_update_as_the_core_says(tmp_path, correction):
    """The batch's weights are klppo.core.mismatch's, each sample a sequence of one."""
    cfg = stale(tmp_path / "run", steps=4096, correction=correction, k=1)
    tr = _Trainer.alone(cfg, tmp_path / "run")
    tr.start()
    for _ in range(2):
        tr.group.iterate([0])
    tr.collect_rollout(3)
    batch = tr.unit.proximal(rollout_batch(tr.unit, tr.collector.buf))
    log_ratio = (batch.logp - tr.collector.buf.logp.reshape(-1))[:, None]
    want = mismatch_weights(log_ratio, torch.ones_like(log_ratio, dtype=torch.bool), correction)
    assert torch.equal(batch.weight, want[:, 0])
    tr.close()


def test_a_fresh_rollout_is_unchanged_by_the_staleness_machinery(tmp_path):
    """staleness 0 (the default): no weights, no mismatch metrics, no past policies kept."""
    res = rl.train(config(tmp_path / "run", steps=1536))
    assert "mismatch_kl_k3" not in res.metrics[-1]
    state = load_checkpoint(res.run_dir)
    assert "past_policies" not in state


def test_stale_runs_train_in_a_group_as_alone(tmp_path):
    """Rows with and without staleness (weights on some rows, 1 on the others) in one stack:
    each run's numbers and checkpoint are its own run's alone, bit for bit."""
    runs = [dict(seed=0, ppo=dict(staleness=2, mismatch_correction="tis")),
            dict(seed=1),
            dict(seed=2, objective="unclipped", ppo=dict(staleness=1, mismatch_correction="m2po"))]
    grouped = train_batched([config(tmp_path / f"b{i}", steps=3072, **v)
                             for i, v in enumerate(runs)])
    alone = [rl.train(config(tmp_path / f"o{i}", steps=3072, **v)) for i, v in enumerate(runs)]
    assert_engines_agree(grouped, alone)
    assert grouped[2].metrics[-1]["mismatch_zeroed"] >= 0.0


def test_torch_stack_stale_runs_train_in_a_group_as_alone(tmp_path):
    cfgs = lambda p: [stale(tmp_path / f"{p}{s}", seed=s, steps=2048, fast_path=False)  # noqa: E731
                      for s in (0, 1)]
    grouped = train_batched(cfgs("g"))
    alone = [rl.train(c) for c in cfgs("a")]
    for g, a in zip(grouped, alone):
        assert strip(g.metrics) == strip(a.metrics)


def test_a_resumed_stale_run_equals_the_uninterrupted_one(tmp_path):
    """The past policies are in every checkpoint: stopped after iteration 3 of 6 and resumed,
    the run's metrics equal the uninterrupted run's."""
    full = rl.train(stale(tmp_path / "full", steps=6 * 512, checkpoint_every=1))

    class Stop(Exception):
        pass

    def stop(m):
        if m["iteration"] == 3:
            raise Stop

    with pytest.raises(rl.TrainingError):
        rl.train(stale(tmp_path / "cut", steps=6 * 512, checkpoint_every=1), on_iteration=stop)
    res = rl.resume(tmp_path / "cut")
    assert res.status == "finished"
    assert strip(res.metrics) == strip(full.metrics)


@pytest.mark.parametrize("forge", ["size", "last"])
def test_a_checkpoint_s_forged_past_policies_are_refused(tmp_path, forge):
    """Vectors of another policy's size, or a list that does not end with the checkpoint's own
    policy (klppo writes the updated policy last), are refused."""
    run = rl.train(stale(tmp_path / "run", steps=1024)).run_dir
    state = load_checkpoint(run)
    past = state["past_policies"]
    if forge == "size":
        state["past_policies"] = [np.zeros(3, np.float32)]  # finite, of another policy's size
    else:
        state["past_policies"] = [past[-1], past[0] + np.float32(0.5)]
    save_checkpoint(run, state)
    with pytest.raises(Exception, match="past_policies"):
        rl.resume(run, total_steps=2048)


@pytest.mark.parametrize("ppo, net, match", [
    (dict(mismatch_correction="tis"), {}, r"ppo.mismatch_correction='tis': only ppo.staleness"),
    (dict(mismatch_upper=3.0), {}, r"ppo.mismatch_upper=3.0: only ppo.staleness"),
    (dict(staleness=1, mismatch_correction="tis", mismatch_lower=0.2), {},
     r"ppo.mismatch_lower=0.2: only the icepop and mis corrections"),
    (dict(staleness=1, mismatch_correction="icepop", mismatch_upper=0.4), {},
     r"ppo.mismatch_upper=0.4: must be above the lower bound 0.5"),
    (dict(staleness=1, mismatch_correction="icepop", mismatch_lower=6.0), {},
     r"ppo.mismatch_lower=6.0: must be below the upper bound 5.0"),
    (dict(staleness=1), dict(shared_trunk=True), r"ppo.staleness=1: needs net.shared_trunk"),
    (dict(staleness=65), {}, r"ppo.staleness=65"),
])
def test_stale_settings_that_mean_nothing_are_refused_in_one_line(tmp_path, ppo, net, match):
    c = config(tmp_path / "run", ppo=ppo)
    c = dataclasses.replace(c, net=dataclasses.replace(c.net, **net))
    with pytest.raises(ConfigError, match=match):
        rl.train(c)
    assert not (tmp_path / "run").exists()


def test_the_weights_are_finite_for_any_stale_log_ratio():
    """(A guard on the core's clamp: a behaviour log-prob far below the proximal one.)"""
    lr = torch.tensor([[80.0], [-80.0], [0.0]])
    w = mismatch_weights(lr, torch.ones_like(lr, dtype=torch.bool), "tis")
    assert all(math.isfinite(float(x)) for x in w)


def test_topr_trains_each_step_its_own_sequence_with_its_ratio_to_the_behaviour(tmp_path):
    """TOPR (tapered off-policy REINFORCE) in klppo train: each step is a sequence of one, so
    its gradient per sample is ``a_t A_t`` with ``a_t = 1`` where ``A_t >= 0`` and
    ``min(pi / mu, 1)`` where ``A_t < 0`` (mean over the minibatch); with a stale rollout its
    ratio stays the behaviour policy's (``mu``), not the proximal one's."""
    from klppo.core.loss import PPOLoss

    g = torch.Generator().manual_seed(0)
    n = 16
    logp_old = -torch.rand(n, generator=g) - 0.1
    logp = (logp_old + 0.5 * torch.randn(n, generator=g)).requires_grad_(True)
    adv = torch.randn(n, generator=g)
    out = PPOLoss("topr")(logp, logp_old, adv, sequence_ids=torch.arange(n))
    (grad,) = torch.autograd.grad(out["loss_objective"], logp)
    a = torch.where(adv >= 0, torch.ones(n), torch.exp(logp - logp_old).detach().clamp(max=1))
    torch.testing.assert_close(grad, -a * adv / n)

    cfg = stale(tmp_path / "run", steps=4096, correction="none", k=1, objective="topr")
    tr = _Trainer.alone(cfg, tmp_path / "run")
    assert not tr.unit.fast  # (no closed form: the torch stack)
    tr.start()
    for _ in range(2):
        res = tr.group.iterate([0])[0]
        assert not isinstance(res, BaseException), res
    tr.collect_rollout(3)
    buf = tr.collector.buf
    batch = tr.unit.proximal(rollout_batch(tr.unit, buf))
    assert torch.equal(batch.logp, buf.logp.reshape(-1)) and batch.weight is None
    assert tr.unit.mismatch["mismatch_kl_k3"] > 0
    tr.close()


def test_topr_refuses_a_correction_and_the_other_sequence_objectives_stay_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"ppo.mismatch_correction='tis': objective='topr' "
                                          r"takes its ratio to the sampling policy"):
        rl.train(stale(tmp_path / "a", objective="topr"))
    with pytest.raises(ConfigError, match=r"objective='gmpo': is sequence-level"):
        rl.train(config(tmp_path / "b", objective="gmpo"))
    with pytest.raises(ConfigError, match=r"ppo.early_stop='minibatch': objective='topr' with "
                                          r"ppo.staleness would measure its KL from the policy 2"):
        rl.train(stale(tmp_path / "c", objective="topr", correction="none",
                       ppo=dict(early_stop="minibatch", target_kl=0.01)))
