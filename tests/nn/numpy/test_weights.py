"""The runner gets its weights handed over: no construction order can make it act on stale ones."""

import numpy as np
import pytest
import torch

from klppo.core.loss import PPOLoss
from klppo.nn import ActorCritic, CategoricalHead, DiagGaussianHead
from klppo.nn.numpy import NumpyRunner, StaleWeights, flat_weights
from klppo.nn.runners import make_runner
from tests.rows import OneRow


def _torch_outputs(agent, obs):
    with torch.no_grad():
        params, value = agent(torch.from_numpy(obs))
    return params.numpy(), value.numpy()


def _steps(agent, step, rng, n=64):
    """Two update steps that move every weight (checked)."""
    before = [p.detach().clone() for p in agent.parameters()]
    for _ in range(2):
        obs = rng.standard_normal((n, 4)).astype(np.float32)
        with torch.no_grad():
            old = agent.policy_params(torch.from_numpy(obs))
            act = agent.head.sample(old)
            lo = agent.head.log_prob(old, act)
        f32 = lambda: rng.standard_normal(n).astype(np.float32)  # noqa: E731
        step.step_arrays(obs, act.numpy(), old.numpy(), lo.numpy(), f32(), f32(), f32(), 0.0)
    assert all(not torch.equal(a, b) for a, b in zip(before, agent.parameters()))


@pytest.mark.parametrize("head", [CategoricalHead(3), DiagGaussianHead(2)], ids=["cat", "gauss"])
@pytest.mark.parametrize("runner_first", [True, False])
def test_runner_acts_on_the_steps_weights_in_either_order(head, runner_first):
    """Runner built before the step (the wrong order under the old aliasing) or after: it acts
    with the weights the step has just written, the same numbers as the torch network."""
    torch.manual_seed(0)
    agent = ActorCritic(4, head, log_std_init=-0.3)
    if runner_first:
        runner = NumpyRunner(agent, flat_weights(agent), seed=0)
        step = OneRow(agent, PPOLoss("clip"), lr=1e-2)
        with pytest.raises(StaleWeights):  # the stack's row superseded the runner's buffer
            runner.act(np.zeros((1, 4), np.float32))
        runner = make_runner(agent, 0, step.slot.weights)
    else:
        step = OneRow(agent, PPOLoss("clip"), lr=1e-2)
        runner = make_runner(agent, 0, step.slot.weights)
    assert isinstance(runner, NumpyRunner) and runner.weights is step.slot.weights
    assert all(np.shares_memory(p.detach().numpy(), step.slot.weights.flat)
               for p in agent.parameters())
    _steps(agent, step, np.random.default_rng(0))
    obs = np.random.default_rng(1).standard_normal((32, 4)).astype(np.float32)
    _, _, params, value = runner.act(obs)
    t_params, t_value = _torch_outputs(agent, obs)
    np.testing.assert_allclose(params, t_params, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(value, t_value, rtol=1e-5, atol=1e-6)


def test_a_runner_on_a_superseded_buffer_refuses_to_act():
    agent = ActorCritic(4, CategoricalHead(2))
    runner = NumpyRunner(agent, flat_weights(agent), seed=0)
    obs = np.zeros((3, 4), np.float32)
    runner.act(obs)
    for p in agent.parameters():  # storage replaced behind the buffer's back
        p.data = p.data.clone()
    fresh = flat_weights(agent)
    assert fresh is not runner.weights and runner.weights.stale
    with pytest.raises(StaleWeights):
        runner.act(obs)
    with pytest.raises(StaleWeights):
        runner.value(obs)
    with pytest.raises(StaleWeights):
        NumpyRunner(agent, runner.weights, seed=0)
    NumpyRunner(agent, fresh, seed=0).act(obs)


def test_weights_of_another_network_are_refused():
    a, b = ActorCritic(4, CategoricalHead(2)), ActorCritic(4, CategoricalHead(2))
    with pytest.raises(StaleWeights):
        NumpyRunner(a, flat_weights(b), seed=0)


def test_flat_weights_is_one_buffer_per_network():
    agent = ActorCritic(4, DiagGaussianHead(2))
    w = flat_weights(agent)
    assert flat_weights(agent) is w and w.is_current()
    agent.load_state_dict({k: torch.zeros_like(v) for k, v in agent.state_dict().items()})
    assert flat_weights(agent) is w and float(np.abs(w.flat).max()) == 0.0
