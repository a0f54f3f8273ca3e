"""The wiring between a config and what trains, checked where a plausible slip passes every other
test (issue #29's mutations): each test here failed with its mutation in place.

* SAPO's two gate temperatures reach the objective on their own sides (``make_loss``);
* the final observation of a truncated episode is normalised before it is bootstrapped, as every
  other observation the critic sees (``Collector``, every MuJoCo preset normalises);
* the entropy bonus has a gradient in the torch stack (``TorchStack.step``; the numpy stack's
  parity tests hold it too);
* an EnvPool reset with a new seed starts other episodes (``EnvPoolSameStep.reset``).
"""

import dataclasses

import numpy as np
import pytest
import torch

from klppo import rl
from klppo.core.trust_regions import SAPO
from klppo.rl.trainer import _Trainer
from klppo.rl.update import make_loss


def test_sapo_temperatures_reach_their_own_sides():
    """A > 0 uses ppo.tau_pos, A < 0 uses ppo.tau_neg: the gate's value on each side equals
    the formula with that side's temperature (and not with the other's)."""
    cfg = rl.validate(dataclasses.replace(rl.preset("klip/cartpole"), objective="sapo"))
    cfg.ppo = dataclasses.replace(cfg.ppo, tau_pos=0.5, tau_neg=3.0)
    policy = make_loss(cfg).policy
    assert isinstance(policy, SAPO)
    w = torch.tensor([1.3, 1.3])
    adv = torch.tensor([1.0, -1.0])
    logp = torch.log(w)
    got = policy.value(w, logp, torch.zeros(2), adv, None)
    gate = lambda tau: 4 / tau * torch.sigmoid(tau * (w - 1))  # noqa: E731
    assert torch.allclose(got[0], gate(torch.tensor(0.5))[0] * adv[0])
    assert torch.allclose(got[1], gate(torch.tensor(3.0))[1] * adv[1])
    assert not torch.allclose(got[1], gate(torch.tensor(0.5))[1] * adv[1])


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_truncated_episode_bootstraps_from_its_normalised_final_observation(tmp_path,
                                                                             fast_path):
    """Pendulum truncates at 200 steps: V(final observation) in ``next_values`` is the critic on
    the final observation normalised as the policy saw its others (the statistics at the
    rollout's end), not on the raw one."""
    cfg = dataclasses.replace(rl.preset("klip/cartpole"), env="Pendulum-v1", tensorboard=False,
                              fast_path=fast_path)
    cfg.rollout = dataclasses.replace(cfg.rollout, num_envs=1, num_steps=448, norm_obs=True,
                                      norm_reward=True)
    tr = _Trainer.alone(rl.validate(cfg), tmp_path)
    try:
        tr.start()
        tr.collect_rollout(1)
        c = tr.collector
        assert len(c.trunc_final) == 2  # steps 199 and 399
        for t, i, final in c.trunc_final:
            norm = c.obs_norm.normalize(final[None].astype(np.float32))
            expect = float(c.runner.value(norm)[0])
            raw = float(c.runner.value(final[None].astype(np.float32))[0])
            # (torch's product rounds otherwise for a batch of one than for the two finals)
            assert float(c.buf.next_values[t, i]) == pytest.approx(expect, rel=1e-4, abs=1e-6)
            assert abs(expect - raw) > 1e-4  # the test can tell the two apart
    finally:
        tr.env.close()


def test_the_torch_stacks_entropy_bonus_has_its_gradient():
    """One torch-stack step with an entropy bonus equals autograd on the whole loss; without
    the entropy term's gradient the policy's parameters would differ."""
    from klppo.core.loss import PPOLoss
    from klppo.nn import ActorCritic, CategoricalHead
    from tests.rows import OneRow

    torch.manual_seed(0)
    agent = ActorCritic(3, CategoricalHead(4))
    ref = ActorCritic(3, CategoricalHead(4))
    ref.load_state_dict(agent.state_dict())
    loss = PPOLoss("clip", ent_coef=0.5)
    n = 32
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((n, 3)).astype(np.float32)
    with torch.no_grad():
        old = agent.policy_params(torch.from_numpy(obs))
    act = torch.zeros(n, dtype=torch.long)
    lo = agent.head.log_prob(old, act)
    adv, ret, vold = (np.zeros(n, np.float32) for _ in range(3))
    OneRow(agent, loss, lr=0.1, library="torch").step_arrays(obs, act.numpy(), old.numpy(),
                                                             lo.numpy(), adv, ret, vold, 0.0)
    opt = torch.optim.Adam(ref.parameters(), lr=0.1, eps=1e-5)
    params, v = ref(torch.from_numpy(obs))
    out = loss(ref.head.log_prob(params, act), lo, torch.from_numpy(adv), v,
               torch.from_numpy(ret), torch.from_numpy(vold), ref.head.entropy(params), None, 0.0)
    out["loss"].backward()
    torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
    opt.step()
    moved = [not torch.equal(a, b) for a, b in zip(ref.actor.parameters(),
                                                    ActorCritic(3, CategoricalHead(4)).actor
                                                    .parameters())]
    assert any(moved)
    for a, b in zip(agent.actor.parameters(), ref.actor.parameters()):
        assert torch.allclose(a, b, atol=1e-6)


def test_an_envpool_reset_with_a_new_seed_starts_other_episodes():
    pytest.importorskip("envpool")
    from klppo.rl.envpool_backend import EnvPoolSameStep

    env = EnvPoolSameStep("CartPole-v1", 2, seed=0)
    try:
        first, _ = env.reset(seed=0)
        other, _ = env.reset(seed=123)
        again, _ = env.reset(seed=0)
    finally:
        env.close()
    assert not np.array_equal(first, other)
    assert np.array_equal(first, again)
