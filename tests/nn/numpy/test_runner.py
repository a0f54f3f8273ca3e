import numpy as np
import pytest
import torch

from klppo.nn import ActorCritic, CategoricalHead, DiagGaussianHead
from klppo.nn.numpy import NumpyRunner, flat_weights
from klppo.nn.runners import TorchRunner, make_runner


def reference_categorical(agent, rng, obs):
    """The textbook numpy sampler the runner must equal bit for bit: softmax with numpy's own
    reductions, inverse-CDF sampling with one uniform per row."""
    with torch.no_grad():
        out = agent.policy_params(torch.from_numpy(obs)).numpy()
        value = agent.value(torch.from_numpy(obs)).numpy()
    z = out - out.max(1, keepdims=True)
    logp_all = z - np.log(np.exp(z).sum(1, keepdims=True))
    cdf = np.cumsum(np.exp(logp_all), 1)
    u = rng.random(obs.shape[0], dtype=np.float32)[:, None] * cdf[:, -1:]
    action = np.minimum((u >= cdf).sum(1), out.shape[1] - 1)
    return action, logp_all[np.arange(obs.shape[0]), action], out, value


@pytest.mark.parametrize("k", [1, 2, 3, 7, 9])
def test_numpy_runner_samples_like_the_reference(k):
    torch.manual_seed(k)
    agent = ActorCritic(5, CategoricalHead(k))
    runner = NumpyRunner(agent, flat_weights(agent), seed=3)
    rng = np.random.Generator(np.random.PCG64(3))
    obs = np.random.default_rng(0).standard_normal((4096, 5)).astype(np.float32) * 3
    action, logp, params, value = runner.act(obs)
    ref = reference_categorical(agent, rng, obs)
    np.testing.assert_array_equal(action, ref[0])
    np.testing.assert_allclose(logp, ref[1], rtol=1e-6, atol=1e-6)  # torch vs numpy forward
    np.testing.assert_allclose(params, ref[2], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(value, ref[3], rtol=1e-5, atol=1e-6)
    if k > 1:
        assert len(np.unique(action)) == k  # every action drawn at this size


def test_categorical_frequencies_follow_the_probabilities():
    torch.manual_seed(0)
    agent = ActorCritic(3, CategoricalHead(3))
    runner = NumpyRunner(agent, flat_weights(agent), seed=0)
    obs = np.tile(np.array([[0.5, -1.0, 2.0]], np.float32), (200_000, 1))
    action, logp, params, _ = runner.act(obs)
    probs = torch.softmax(torch.from_numpy(params[0]), 0).numpy()
    freq = np.bincount(action, minlength=3) / len(action)
    sigma = np.sqrt(probs * (1 - probs) / len(action))
    assert np.all(np.abs(freq - probs) < 6 * sigma)
    np.testing.assert_allclose(logp, np.log(probs)[action], rtol=1e-5)


def test_gaussian_runner_logp_matches_the_head():
    torch.manual_seed(0)
    agent = ActorCritic(4, DiagGaussianHead(2), log_std_init=-0.5)
    runner = make_runner(agent, 1, flat_weights(agent))
    assert isinstance(runner, NumpyRunner)
    obs = np.random.default_rng(1).standard_normal((512, 4)).astype(np.float32)
    action, logp, params, _ = runner.act(obs)
    expect = agent.head.log_prob(torch.from_numpy(params), torch.from_numpy(action))
    np.testing.assert_allclose(logp, expect.numpy(), rtol=1e-5, atol=1e-5)


def test_shared_trunk_falls_back_to_torch():
    agent = ActorCritic(4, CategoricalHead(2), shared_trunk=True)
    assert isinstance(make_runner(agent, 0), TorchRunner)
    with pytest.raises(ValueError, match="separate"):
        NumpyRunner(agent, flat_weights(agent), 0)
