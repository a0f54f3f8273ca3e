"""`klppo rlhf --rollout-dtype bfloat16`: responses sampled by a bfloat16 copy of the float32
policy, the mismatch logged, and each correction's weights reaching the loss."""

import pytest
import torch

pytest.importorskip("transformers")

from klppo.core.loss import PPOLoss  # noqa: E402
from klppo.lm.config import ConfigError, RLHFConfig  # noqa: E402
from klppo.lm.config_checks import validate_rlhf  # noqa: E402
from klppo.lm.rlhf import RLHFError, resume_rlhf, rlhf  # noqa: E402
from tests.lm.conftest import TINY  # noqa: E402
from tests.lm.test_resume import Crash, reward, strip  # noqa: E402


def _cfg(model, out, **kw):
    return RLHFConfig(model=str(model), out=str(out), **{**TINY, "iterations": 3, **kw})


@pytest.mark.parametrize("correction", ["tis", "mis", "icepop"])
def test_a_bfloat16_sampler_is_measured_and_corrected(tiny_model_dir, tmp_path, monkeypatch,
                                                      correction):
    seen = []
    call = PPOLoss.__call__

    def spy(self, *args, sample_weight=None, **kwargs):
        seen.append(sample_weight)
        return call(self, *args, sample_weight=sample_weight, **kwargs)

    monkeypatch.setattr(PPOLoss, "__call__", spy)
    res = rlhf(_cfg(tiny_model_dir, tmp_path / "run", rollout_dtype="bfloat16",
                    mismatch_correction=correction), reward=reward)
    for m in res.metrics:
        assert m["mismatch_kl_k3"] > 0 and m["mismatch_ratio_max"] > 1  # bf16 != fp32
        assert 0 <= m["mismatch_zeroed"] < 1
    assert seen and all(w is not None and not torch.all(w == 1) for w in seen)


def test_float32_sampling_logs_nothing_and_weights_nothing(tiny_model_dir, tmp_path):
    res = rlhf(_cfg(tiny_model_dir, tmp_path / "run"), reward=reward)
    assert not any(k.startswith("mismatch_") for k in res.metrics[0])


def test_a_resume_with_a_bfloat16_sampler_is_exact(tiny_model_dir, tmp_path):
    """The sampler is synced from the policy before every generation: derived state, nothing
    to checkpoint; a crash after iteration 5 (checkpoint at 3) resumes to the same metrics."""
    kw = dict(rollout_dtype="bfloat16", mismatch_correction="tis", iterations=6)
    full = rlhf(_cfg(tiny_model_dir, tmp_path / "full", **kw), reward=reward)
    run = tmp_path / "run"

    def crash(m):
        if m["iteration"] == 5:
            raise Crash("simulated crash")

    with pytest.raises(RLHFError):
        rlhf(_cfg(tiny_model_dir, run, **kw), reward=reward, on_iteration=crash)
    assert strip(resume_rlhf(run, reward=reward).metrics) == strip(full.metrics)


def test_mismatch_settings_are_refused_where_nothing_reads_them():
    with pytest.raises(ConfigError, match=r"mismatch_upper=3.0: only a mismatch correction"):
        validate_rlhf(RLHFConfig(mismatch_upper=3.0))
    with pytest.raises(ConfigError, match=r"mismatch_lower=0.2: only the icepop and mis "):
        validate_rlhf(RLHFConfig(mismatch_correction="tis", mismatch_lower=0.2, staleness=1))
    with pytest.raises(ConfigError, match=r"mismatch_reject=5.0: only the m2po correction"):
        validate_rlhf(RLHFConfig(mismatch_correction="tis", mismatch_reject=5.0, staleness=1))
    with pytest.raises(ConfigError, match=r"mismatch_correction='tis': needs temperature 1"):
        validate_rlhf(RLHFConfig(mismatch_correction="tis", temperature=0.7, staleness=1))
    # a float32 sampler of the current policy: every weight would be 1
    with pytest.raises(ConfigError, match=r"mismatch_correction='tis': needs a sampler that "):
        validate_rlhf(RLHFConfig(mismatch_correction="tis"))
    validate_rlhf(RLHFConfig(mismatch_correction="m2po", mismatch_reject=5.0, staleness=1))


def test_a_stale_sampler_is_the_policy_staleness_updates_back(tiny_model_dir, tmp_path,
                                                              monkeypatch):
    """staleness 2: iterations 1-3 sample with the initial policy, iteration 4 with the policy
    after update 1. The sampler's log-probabilities equal that policy's, scored apart."""
    from klppo.lm import experiment as E

    seen = []
    generate = E.generate

    def spy(model, *args, **kwargs):
        seen.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        return generate(model, *args, **kwargs)

    monkeypatch.setattr(E, "generate", spy)
    snapshots = []
    update = E.Experiment.update

    def after(self, *args, **kwargs):
        out = update(self, *args, **kwargs)
        snapshots.append({k: v.detach().clone() for k, v in self.policy.lm.state_dict().items()})
        return out

    monkeypatch.setattr(E.Experiment, "update", after)
    res = rlhf(_cfg(tiny_model_dir, tmp_path / "run", iterations=4, staleness=2,
                    mismatch_correction="m2po", objective="unclipped"), reward=reward)
    first = seen[0]
    same = lambda a, b: all(torch.equal(a[k], b[k]) for k in a)  # noqa: E731
    assert same(seen[1], first) and same(seen[2], first) and same(seen[3], snapshots[0])
    assert not same(seen[3], first)
    k3 = [m["mismatch_kl_k3"] for m in res.metrics]
    assert k3[0] < 1e-6 < k3[2]  # iteration 1 samples with the current policy, 3 with a stale one


def test_a_resume_with_a_stale_sampler_is_exact(tiny_model_dir, tmp_path):
    kw = dict(staleness=2, mismatch_correction="tis", iterations=6)
    full = rlhf(_cfg(tiny_model_dir, tmp_path / "full", **kw), reward=reward)
    run = tmp_path / "run"

    def crash(m):
        if m["iteration"] == 5:
            raise Crash("simulated crash")

    with pytest.raises(RLHFError):
        rlhf(_cfg(tiny_model_dir, run, **kw), reward=reward, on_iteration=crash)
    assert strip(resume_rlhf(run, reward=reward).metrics) == strip(full.metrics)


@pytest.mark.parametrize("objective, to_sampler", [("topr", True), ("clip", False)])
def test_topr_takes_its_ratio_to_the_stale_sampler(tiny_model_dir, tmp_path, monkeypatch,
                                                   objective, to_sampler):
    """staleness 2: TOPR's ratio divides by the sampler's log-probabilities (the behaviour
    policy, the paper's mu); PPO-Clip's by the policy before the update. One epoch: each
    iteration's loss calls see every response token once."""
    from klppo.lm import experiment as E

    sampled, seen = [], []
    generate, call = E.generate, PPOLoss.__call__

    def spy_generate(*args, **kwargs):
        responses, logp = generate(*args, **kwargs)
        sampled.append(logp.detach().clone())
        return responses, logp

    def spy(self, logp_new, logp_old, *args, **kwargs):
        seen.append((len(sampled), logp_new.detach().clone(), logp_old.clone()))
        return call(self, logp_new, logp_old, *args, **kwargs)

    monkeypatch.setattr(E, "generate", spy_generate)
    monkeypatch.setattr(PPOLoss, "__call__", spy)
    rlhf(_cfg(tiny_model_dir, tmp_path / "run", objective=objective, staleness=2,
              iterations=4), reward=reward)
    it = 4  # the policy has moved 2 updates past the sampler
    olds = torch.cat([old for i, _, old in seen if i == it])
    sampler = sampled[it - 1].reshape(-1)  # every response token (no EOS stop)
    assert torch.equal(torch.sort(olds).values, torch.sort(sampler).values) == to_sampler
    first_new, first_old = next((new, old) for i, new, old in seen if i == it)
    assert torch.equal(first_new, first_old) != to_sampler  # the proximal policy's


def test_topr_refuses_a_second_correction_of_the_same_ratio():
    with pytest.raises(ConfigError, match=r"mismatch_correction='tis': objective='topr' takes "
                                          r"its ratio to the sampling policy already"):
        validate_rlhf(RLHFConfig(objective="topr", staleness=1, mismatch_correction="tis"))
